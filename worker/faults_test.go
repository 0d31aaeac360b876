package worker

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/fedstream/fedstream/worker/dataplane"
)

// A worker given a Faults accepts data-plane connections through it: an
// incoming cut closes what it accepts; healed, connections stay up.
func TestWorkerListenerObeysFaults(t *testing.T) {
	faults := dataplane.NewFaults()
	w, err := New(Config{Org: "acme", Name: "w", Coordinators: []string{"127.0.0.1:1"}, InsecurePlaintext: true, Faults: faults})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Listen(); err != nil {
		t.Fatal(err)
	}
	defer w.lis.Close()
	accepted := make(chan net.Conn, 2)
	go func() {
		for {
			c, err := w.lis.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	faults.CutIncoming(dataplane.Reset)
	c, err := net.Dial("tcp", w.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	<-accepted
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		// A reset connection reads EOF (or a reset error): not a timeout.
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatal("the cut connection stayed open")
		}
	}
	faults.CutIncoming(dataplane.Open)
	c2, err := net.Dial("tcp", w.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	s := <-accepted
	defer s.Close()
	if _, err := s.Write([]byte("x")); err != nil {
		t.Fatalf("healed link: %v", err)
	}
	_ = c2.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c2.Read(make([]byte, 1)); err != nil {
		t.Fatalf("healed link: %v", err)
	}
}
