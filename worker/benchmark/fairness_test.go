package benchmark

import (
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"maps"
	"net"
	"testing"
	"time"

	"github.com/fedstream/fedstream/rpc"
	"github.com/fedstream/fedstream/rpc/tlsutil"
	"github.com/fedstream/fedstream/worker/source"
	"github.com/fedstream/fedstream/worker/tuple"
)

// The raw baseline generates its records with the forward pipeline's
// generator (it used to write one constant record n times): record i
// carries the generator's i-th sequence number, stime and payload.
func TestRawSenderGeneratesItsRecords(t *testing.T) {
	const n = 500
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	got := make(chan []byte, 1)
	go func() {
		c, err := lis.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		b, _ := io.ReadAll(c)
		got <- b
	}()
	resp, err := sendRecords(t.Context(), lis.Addr().String(), n, RawRecordBytes, nil)
	if err != nil {
		t.Fatal(err)
	}
	data := <-got
	if resp.Records != n || len(data) != n*RawRecordBytes {
		t.Fatalf("sent %d records, received %d bytes; want %d records of %d bytes", resp.Records, len(data), n, RawRecordBytes)
	}
	gen, err := source.NewGenerator(blobGenerator(n), 0)
	if err != nil {
		t.Fatal(err)
	}
	var tp tuple.Tuple
	distinct := map[string]bool{}
	for i := 0; gen.Next(&tp); i++ {
		rec := data[i*RawRecordBytes : (i+1)*RawRecordBytes]
		payload := tp.Values[1].S
		if rec[0] != recordMarker ||
			binary.LittleEndian.Uint64(rec[rawSeqAt:]) != uint64(tp.Values[0].I) ||
			binary.LittleEndian.Uint64(rec[rawSTimeAt:]) != uint64(tp.STime) ||
			string(rec[rawPayloadAt:rawPayloadAt+len(payload)]) != payload {
			t.Fatalf("record %d is not the generator's record %d (seq %d)", i, i, tp.Values[0].I)
		}
		distinct[string(rec)] = true
	}
	if len(distinct) < n/2 {
		t.Fatalf("only %d distinct records of %d", len(distinct), n)
	}
}

// The raw receiver checks each record's sequence number, as the engine's
// reader checks ids: a lost or repeated record is an error, not a count.
func TestReceiveRecordsRejectsOutOfSequence(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	done := make(chan error, 1)
	go func() {
		_, err := receiveRecords(t.Context(), lis, RawRecordBytes, 0)
		done <- err
	}()
	conn, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	var stream []byte
	for _, seq := range []int64{0, 1, 3} { // record 2 is missing
		rec := make([]byte, RawRecordBytes)
		encodeRawRecord(rec, &tuple.Tuple{Values: []tuple.Value{tuple.Int(seq), tuple.Str("payload")}})
		stream = append(stream, rec...)
	}
	if _, err := conn.Write(stream); err != nil {
		t.Fatal(err)
	}
	_ = conn.Close()
	if err := <-done; !errors.Is(err, ErrBadStream) {
		t.Fatalf("a gap in the sequence gave %v, want ErrBadStream", err)
	}
}

// The raw baseline is timed from its request, before the connection and
// its TLS handshake, as engine runs are timed from before their tasks
// start and connect (it used to start after the handshake).
func TestRawSenderTimedFromBeforeConnecting(t *testing.T) {
	ca, err := tlsutil.NewCA("bench")
	if err != nil {
		t.Fatal(err)
	}
	configs := make([]*tls.Config, 2)
	for i, name := range []string{"w1", "w2"} {
		cert, key, err := ca.Issue(rpc.Identity{Org: "bench", Role: rpc.RoleWorker, Name: name}, []string{"127.0.0.1"}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		c, err := tlsutil.New(ca.CertPEM)
		if err == nil {
			err = c.SetCertificate(cert, key)
		}
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			configs[i] = c.ServerConfig(tlsutil.Peer{}, false)
		} else {
			configs[i] = c.ClientConfig(tlsutil.Peer{})
		}
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	// The server takes the time, then lets the handshake go on: a start
	// taken after the handshake is later than it.
	accepted := make(chan int64, 1)
	go func() {
		c, err := lis.Accept()
		if err != nil {
			accepted <- 0
			return
		}
		accepted <- time.Now().UnixNano()
		s := tlsutil.Server(c, configs[0])
		defer s.Close()
		_, _ = io.Copy(io.Discard, s)
	}()
	resp, err := sendRecords(t.Context(), lis.Addr().String(), 10, RawRecordBytes, configs[1])
	if err != nil {
		t.Fatal(err)
	}
	if at := <-accepted; resp.StartNanos == 0 || resp.StartNanos > at {
		t.Fatalf("raw send timed from %d, after the server accepted its connection at %d", resp.StartNanos, at)
	}
}

// Word counts are checked word by word: a result with the right total but
// one word counted once too often and another once too rarely is refused
// (the engine's used to be checked by its total's bounds only).
func TestWordCountsCheckedExactly(t *testing.T) {
	const n = 2000
	var b bench
	want, err := referenceWordCounts(n, benchSeed)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.checkWordCounts("engine", n, maps.Clone(want)); err != nil {
		t.Fatalf("the reference itself was refused: %v", err)
	}
	bad := maps.Clone(want)
	moved := 0
	for w := range bad {
		if moved == 0 {
			bad[w]++
		} else {
			bad[w]--
			break
		}
		moved++
	}
	if err := b.checkWordCounts("engine", n, bad); !errors.Is(err, ErrMismatch) {
		t.Fatalf("counts with the right total but two words wrong gave %v, want ErrMismatch", err)
	}
	extra := maps.Clone(want)
	extra["not-a-generated-word"] = 1
	if err := b.checkWordCounts("engine", n, extra); !errors.Is(err, ErrMismatch) {
		t.Fatalf("an extra word gave %v, want ErrMismatch", err)
	}
}
