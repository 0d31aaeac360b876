package worker

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// arrivalCoord notes when each report arrived.
type arrivalCoord struct {
	pb.UnimplementedWorkerServiceServer
	arrived chan time.Time
}

func (c *arrivalCoord) ReportTasks(context.Context, *pb.ReportTasksRequest) (*pb.ReportTasksResponse, error) {
	c.arrived <- time.Now()
	return &pb.ReportTasksResponse{}, nil
}

// BenchmarkSmallCallBusyProcess measures a small report's way from the
// call to the coordinator's handler (sent-ms) and back (returned-ms),
// medians, over loopback gRPC in one process, idle (busy=0) or with
// every core's run queue never empty (busy=N goroutines doing 20 µs of
// work between yields). A goroutine waiting for the network is made
// runnable when a core polls it, which a core with runnable goroutines
// does not do (only the runtime's monitor, every 10 ms or so): in the
// busy process each hop waits about that long. It is what a plan's
// delivery and acknowledgement hops meet in `bench reconfig`'s
// one-process org when its cores are saturated. (gRPC's write buffer,
// tried too, made no difference: its writer's yield before flushing a
// small write is not the wait.)
//
//	go test -run '^$' -bench SmallCallBusyProcess -benchtime 300x ./worker/
func BenchmarkSmallCallBusyProcess(b *testing.B) {
	for _, busy := range []int{0, 4 * runtime.GOMAXPROCS(0)} {
		b.Run(fmt.Sprintf("busy=%d", busy), func(b *testing.B) {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			coord := &arrivalCoord{arrived: make(chan time.Time, 1)}
			g := grpc.NewServer()
			pb.RegisterWorkerServiceServer(g, coord)
			go func() { _ = g.Serve(lis) }()
			defer g.Stop()
			conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			client := pb.NewWorkerServiceClient(conn)
			req := &pb.ReportTasksRequest{WorkerId: "w-1", Tasks: []*pb.TaskState{{TaskId: "q/f/p0/r0", Reconfig: &pb.ReconfigProgress{Acked: 1}}}}
			if _, err := client.ReportTasks(context.Background(), req); err != nil {
				b.Fatal(err)
			}
			<-coord.arrived
			var stop atomic.Bool
			var wg sync.WaitGroup
			for range busy {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for !stop.Load() {
						for t := time.Now(); time.Since(t) < 20*time.Microsecond; {
						}
						runtime.Gosched()
					}
				}()
			}
			var sent, returned []float64
			ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
			b.ResetTimer()
			for range b.N {
				start := time.Now()
				if _, err := client.ReportTasks(context.Background(), req); err != nil {
					b.Fatal(err)
				}
				back := time.Now()
				sent, returned = append(sent, ms((<-coord.arrived).Sub(start))), append(returned, ms(back.Sub(start)))
			}
			b.StopTimer()
			stop.Store(true)
			wg.Wait()
			slices.Sort(sent)
			slices.Sort(returned)
			b.ReportMetric(sent[len(sent)/2], "sent-ms")
			b.ReportMetric(returned[len(returned)/2], "returned-ms")
		})
	}
}
