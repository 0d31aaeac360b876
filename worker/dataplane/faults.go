package dataplane

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
)

// ErrLinkCut is what a connection or dial through a cut link (Faults,
// mode Reset) fails with.
var ErrLinkCut = errors.New("dataplane: link cut by fault injection")

// CutMode says how a cut link fails.
type CutMode uint8

const (
	// Open: the link works.
	Open CutMode = iota
	// Reset: connections over the link are closed at once and new dials
	// fail, as when the peer's host refuses or resets connections. A
	// subscription over it fails promptly.
	Reset
	// Hold: nothing crosses the link, nothing fails: reads and writes on
	// its connections wait, and dials wait (until their context ends), as
	// in a network partition that drops packets silently. When the link
	// is healed, held connections continue where they were, nothing
	// lost. Only a timeout notices a held link.
	Hold
)

func (m CutMode) String() string {
	switch m {
	case Open:
		return "open"
	case Reset:
		return "reset"
	case Hold:
		return "hold"
	}
	return fmt.Sprintf("CutMode(%d)", uint8(m))
}

// Faults injects network faults into one worker's data plane, for tests
// and by hand: its outgoing connections to a given peer address (the
// subscriptions of its tasks, which pull their input from that peer) and
// its incoming connections (every subscription to its tasks' outputs)
// can be cut and healed. Data flows from the peer that is dialed to the
// one that dials, so cutting peer A's dials to B stops B's output
// reaching A; cutting both A's dials to B and B's dials to A cuts the
// link both ways.
//
// A worker without a Faults gets no hook at all (no dialer, no listener
// wrapper): the fault injection costs nothing when unused.
type Faults struct {
	mu    sync.Mutex
	cond  *sync.Cond
	out   map[string]CutMode // by dialed address (host:port)
	in    CutMode            // every incoming connection
	conns map[*faultConn]struct{}
	// read counts the bytes read over connections to each dialed address.
	read map[string]*atomic.Int64
}

// NewFaults returns a Faults with every link open.
func NewFaults() *Faults {
	f := &Faults{out: map[string]CutMode{}, conns: map[*faultConn]struct{}{}, read: map[string]*atomic.Int64{}}
	f.cond = sync.NewCond(&f.mu)
	return f
}

// DialOption makes a Pool dial through f (give it to NewPool).
func (f *Faults) DialOption() grpc.DialOption {
	return grpc.WithContextDialer(f.dial)
}

// Dial dials addr through the faults, as DialOption's dialer does, for a
// caller that wraps the connection further.
func (f *Faults) Dial(ctx context.Context, addr string) (net.Conn, error) { return f.dial(ctx, addr) }

// Listener wraps a data-plane listener so that incoming connections obey
// CutIncoming.
func (f *Faults) Listener(l net.Listener) net.Listener { return &faultListener{Listener: l, f: f} }

// CutOutgoing cuts (mode Reset or Hold) or heals (Open) this worker's
// connections to addr, the peer's data-plane address as dialed
// ("127.0.0.1:7001").
func (f *Faults) CutOutgoing(addr string, mode CutMode) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if mode == Open {
		delete(f.out, addr)
	} else {
		f.out[addr] = mode
	}
	f.changedLocked()
}

// CutIncoming cuts or heals every connection to this worker's data plane.
func (f *Faults) CutIncoming(mode CutMode) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.in = mode
	f.changedLocked()
}

// HealAll opens every link.
func (f *Faults) HealAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(f.out)
	f.in = Open
	f.changedLocked()
}

// BytesFrom is how many bytes this worker has read over its connections to
// addr (for tests: which peer its subscriptions read from).
func (f *Faults) BytesFrom(addr string) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c := f.read[addr]; c != nil {
		return c.Load()
	}
	return 0
}

// changedLocked closes the connections of links now in Reset and wakes
// everything waiting on a held link.
func (f *Faults) changedLocked() {
	for c := range f.conns {
		if f.modeLocked(c) == Reset {
			c.closeLocked()
		}
	}
	f.cond.Broadcast()
}

func (f *Faults) modeLocked(c *faultConn) CutMode {
	if c.incoming {
		return f.in
	}
	return f.out[c.addr]
}

func (f *Faults) dial(ctx context.Context, addr string) (net.Conn, error) {
	f.mu.Lock()
	// A held link swallows the dial: it waits until healed or ctx ends.
	stop := context.AfterFunc(ctx, func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.cond.Broadcast()
	})
	defer stop()
	for f.out[addr] == Hold && ctx.Err() == nil {
		f.cond.Wait()
	}
	mode := f.out[addr]
	f.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if mode == Reset {
		return nil, fmt.Errorf("dial %s: %w", addr, ErrLinkCut)
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return f.track(conn, addr, false), nil
}

func (f *Faults) track(conn net.Conn, addr string, incoming bool) net.Conn {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := &faultConn{Conn: conn, f: f, addr: addr, incoming: incoming}
	if !incoming {
		if f.read[addr] == nil {
			f.read[addr] = &atomic.Int64{}
		}
		c.read = f.read[addr]
	}
	f.conns[c] = struct{}{}
	if f.modeLocked(c) == Reset {
		c.closeLocked()
	}
	return c
}

type faultListener struct {
	net.Listener
	f *Faults
}

func (l *faultListener) Accept() (net.Conn, error) {
	conn, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return l.f.track(conn, conn.RemoteAddr().String(), true), nil
}

// faultConn is a connection over a link Faults controls.
type faultConn struct {
	net.Conn
	f        *Faults
	addr     string
	incoming bool
	read     *atomic.Int64 // outgoing only
	closed   bool          // guarded by f.mu
}

// pass waits while the link is held; it fails once the connection is
// closed or the link reset.
func (c *faultConn) pass() error {
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	for !c.closed && c.f.modeLocked(c) == Hold {
		c.f.cond.Wait()
	}
	if c.closed {
		return ErrLinkCut
	}
	return nil
}

// Read returns what arrived only while the link is open: bytes that
// arrive on a held link are kept until it heals.
func (c *faultConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if perr := c.pass(); perr != nil {
		return 0, perr
	}
	if c.read != nil {
		c.read.Add(int64(n))
	}
	return n, err
}

func (c *faultConn) Write(p []byte) (int, error) {
	if err := c.pass(); err != nil {
		return 0, err
	}
	return c.Conn.Write(p)
}

func (c *faultConn) Close() error {
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	c.closeLocked()
	return nil
}

func (c *faultConn) closeLocked() {
	if !c.closed {
		c.closed = true
		_ = c.Conn.Close()
		delete(c.f.conns, c)
		c.f.cond.Broadcast()
	}
}

// ParseFaults reads a fault specification, one directive per line
// ("#" starts a comment):
//
//	cut ADDR [hold|reset]    cut this worker's connections to ADDR (default reset)
//	cut-incoming [hold|reset] cut every connection to this worker
//
// Links not named are open.
func ParseFaults(spec string) (out map[string]CutMode, in CutMode, err error) {
	out = map[string]CutMode{}
	sc := bufio.NewScanner(strings.NewReader(spec))
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		mode := Reset
		arg := 1
		if f[0] == "cut" {
			arg = 2
		}
		if len(f) > arg+1 || (f[0] == "cut" && len(f) < 2) {
			return nil, Open, fmt.Errorf("faults line %d: %q: want `cut ADDR [hold|reset]` or `cut-incoming [hold|reset]`", n, line)
		}
		if len(f) == arg+1 {
			switch f[arg] {
			case "hold":
				mode = Hold
			case "reset":
			default:
				return nil, Open, fmt.Errorf("faults line %d: mode %q (want hold or reset)", n, f[arg])
			}
		}
		switch f[0] {
		case "cut":
			out[f[1]] = mode
		case "cut-incoming":
			in = mode
		default:
			return nil, Open, fmt.Errorf("faults line %d: unknown directive %q (want cut or cut-incoming)", n, f[0])
		}
	}
	return out, in, sc.Err()
}

// Set replaces every cut by those of a specification (ParseFaults).
func (f *Faults) Set(spec string) error {
	out, in, err := ParseFaults(spec)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.out, f.in = out, in
	f.changedLocked()
	return nil
}

// Watch applies the specification in file path every time it changes,
// polling every interval, until ctx ends: faults by hand (edit the file
// to cut, empty or remove it to heal). A missing file means no fault; a
// file that does not parse is reported through report and ignored.
func (f *Faults) Watch(ctx context.Context, path string, every time.Duration, report func(error)) {
	last := "\x00" // never a file's content
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	for {
		data, err := os.ReadFile(path)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			report(err)
		} else if string(data) != last {
			last = string(data)
			if err := f.Set(last); err != nil {
				report(err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}
