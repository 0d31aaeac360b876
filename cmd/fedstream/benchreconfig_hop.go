package main

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/fedstream/fedstream/worker/benchmark"
)

// hopEvery is how often the hop baseline samples. Not a multiple of the
// generators' pacing, so that samples fall at every phase of it.
const hopEvery = 13 * time.Millisecond

// hopBaseline measures, in this process and while a strategy's stream runs
// in it, the two messages every live update is made of at their cheapest:
// a raw loopback TCP write reaching a reader goroutine (one way, stamped
// with this process's clock) and a plaintext gRPC unary round trip (the
// health service, nothing to compute). A live update sends the plan to
// each worker and an acknowledgement back, each through gRPC over mutual
// TLS, with Raft and the tasks' installs around them: these figures are
// the floor no design of that path goes under on this machine at this
// load, measured where the update's own messages run.
type hopBaseline struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	ln     net.Listener
	srv    *grpc.Server
	conn   *grpc.ClientConn

	mu     sync.Mutex
	oneWay []time.Duration
	rtt    []time.Duration
	err    error
}

// startHopBaseline starts sampling until stop.
func startHopBaseline(ctx context.Context) (*hopBaseline, error) {
	h := &hopBaseline{}
	var err error
	if h.ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		return nil, err
	}
	glis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = h.ln.Close()
		return nil, err
	}
	h.srv = grpc.NewServer()
	healthpb.RegisterHealthServer(h.srv, health.NewServer())
	if h.conn, err = grpc.NewClient(glis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		_ = h.ln.Close()
		_ = glis.Close()
		return nil, err
	}
	ctx, h.cancel = context.WithCancel(ctx)
	h.wg.Add(3)
	go func() {
		defer h.wg.Done()
		_ = h.srv.Serve(glis) // ends with srv.Stop in stop
	}()
	go func() {
		defer h.wg.Done()
		h.receive()
	}()
	go func() {
		defer h.wg.Done()
		h.send(ctx)
	}()
	return h, nil
}

// receive reads the stamped writes of send and records how long each took
// to reach it.
func (h *hopBaseline) receive() {
	c, err := h.ln.Accept()
	if err != nil {
		return
	}
	defer c.Close()
	var buf [8]byte
	for {
		if _, err := io.ReadFull(c, buf[:]); err != nil {
			return
		}
		took := time.Since(time.Unix(0, int64(binary.LittleEndian.Uint64(buf[:]))))
		h.mu.Lock()
		h.oneWay = append(h.oneWay, took)
		h.mu.Unlock()
	}
}

// send writes a stamp and makes a gRPC call every hopEvery until ctx ends.
func (h *hopBaseline) send(ctx context.Context) {
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", h.ln.Addr().String())
	if err != nil {
		h.fail(err)
		return
	}
	defer c.Close()
	client := healthpb.NewHealthClient(h.conn)
	tick := time.NewTicker(hopEvery)
	defer tick.Stop()
	var buf [8]byte
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		binary.LittleEndian.PutUint64(buf[:], uint64(time.Now().UnixNano()))
		if _, err := c.Write(buf[:]); err != nil {
			h.fail(err)
			return
		}
		t0 := time.Now()
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := client.Check(cctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				h.fail(err)
			}
			return
		}
		h.mu.Lock()
		h.rtt = append(h.rtt, time.Since(t0))
		h.mu.Unlock()
	}
}

func (h *hopBaseline) fail(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.err == nil {
		h.err = err
	}
}

// errNoHopSamples: the hop baseline ended without a sample.
var errNoHopSamples = errors.New("hop baseline: no sample taken")

// stop ends the sampling and returns the medians.
func (h *hopBaseline) stop() (benchmark.HopBaseline, error) {
	h.cancel()
	h.srv.Stop()
	_ = h.conn.Close()
	_ = h.ln.Close()
	h.wg.Wait()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.err != nil {
		return benchmark.HopBaseline{}, h.err
	}
	if len(h.oneWay) == 0 || len(h.rtt) == 0 {
		return benchmark.HopBaseline{}, errNoHopSamples
	}
	return benchmark.HopBaseline{
		TCPOneWayMsP50:     medianMs(h.oneWay),
		GRPCRoundTripMsP50: medianMs(h.rtt),
		Samples:            min(len(h.oneWay), len(h.rtt)),
	}, nil
}

func medianMs(d []time.Duration) float64 {
	ms := make([]float64, len(d))
	for i, x := range d {
		ms[i] = msOf(x)
	}
	return medianOf(ms)
}
