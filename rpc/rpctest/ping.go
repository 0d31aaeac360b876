// Package rpctest holds helpers for tests of fedstream's gRPC servers.
package rpctest

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"golang.org/x/net/http2"
)

// ErrGoAway is returned by IdlePings when the server sent a GoAway.
var ErrGoAway = errors.New("server sent GOAWAY")

// IdlePings opens a bare HTTP/2 connection to a gRPC server at addr (over
// TLS with conf when it is not nil, as h2 via ALPN), opens no stream, and sends n pings spaced interval apart, as a client whose
// keepalive fires on an idle connection would. It returns an error
// wrapping ErrGoAway (with the server's debug data, e.g. "too_many_pings")
// if the server turned the connection away, nil if every ping was
// answered.
func IdlePings(addr string, conf *tls.Config, interval time.Duration, n int) error {
	var conn net.Conn
	var err error
	if conf != nil {
		conf = conf.Clone()
		conf.NextProtos = []string{"h2"}
		conn, err = tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, conf)
	} else {
		conn, err = net.DialTimeout("tcp", addr, 5*time.Second)
	}
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(http2.ClientPreface)); err != nil {
		return err
	}
	fr := http2.NewFramer(conn, conn)
	var wmu sync.Mutex // the framer's writes are not safe for concurrent use
	if err := fr.WriteSettings(); err != nil {
		return err
	}
	acks := make(chan struct{}, n)
	readErr := make(chan error, 1)
	go func() {
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				readErr <- err
				return
			}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if !f.IsAck() {
					wmu.Lock()
					_ = fr.WriteSettingsAck()
					wmu.Unlock()
				}
			case *http2.PingFrame:
				if f.IsAck() {
					acks <- struct{}{}
				}
			case *http2.GoAwayFrame:
				readErr <- fmt.Errorf("%w: code %v, debug %q", ErrGoAway, f.ErrCode, f.DebugData())
				return
			}
		}
	}()
	for i := range n {
		if i > 0 {
			time.Sleep(interval) // the pacing under test, not synchronisation
		}
		wmu.Lock()
		err := fr.WritePing(false, [8]byte{byte(i)})
		wmu.Unlock()
		if err != nil {
			select {
			case rerr := <-readErr:
				return rerr
			default:
				return err
			}
		}
		select {
		case <-acks:
		case err := <-readErr:
			return err
		case <-time.After(10 * time.Second):
			return fmt.Errorf("ping %d: no answer within 10s", i)
		}
	}
	// A GoAway may follow the last ack.
	select {
	case err := <-readErr:
		return err
	case <-time.After(200 * time.Millisecond):
		return nil
	}
}
