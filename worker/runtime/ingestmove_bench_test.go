package runtime

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/dataplane"
)

// BenchmarkIngestSession compares feeding an ingest source (one replica,
// keyed aggregate behind it) through the plain Ingest call (requests
// pipelined, one answer at the end) with IngestSession through
// dataplane.IngestClient (each batch acknowledged before the next), in
// batches of 1000 lines; ns/op is per line. Every iteration sends newer
// records than the last, so none is late.
func BenchmarkIngestSession(b *testing.B) {
	const batch = 1000
	for _, mode := range []string{"Ingest", "IngestSession"} {
		b.Run(mode, func(b *testing.B) {
			c := newCluster(b, 1, fmt.Sprintf(ingestMoveQuery, 1), func(string, int, int) int { return 0 })
			defer c.close(b)
			c.apply()
			id := queryspec.TaskID("ing", "events", 0, 0)
			addr := c.addrOf(id)
			conn, err := c.pool.Conn(addr)
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			var reqs [][]byte
			for i := 0; i < b.N; i += batch {
				var sb strings.Builder
				for j := i; j < min(i+batch, b.N); j++ {
					fmt.Fprintf(&sb, `{"time": %d, "user": "u%d", "amount": %d}`+"\n", int64(j+1)*1_000_000, j%7, j%5)
				}
				reqs = append(reqs, []byte(sb.String()))
			}
			b.ResetTimer()
			switch mode {
			case "Ingest":
				stream, err := fedstreampb.NewDataPlaneClient(conn).Ingest(ctx)
				if err != nil {
					b.Fatal(err)
				}
				for i, lines := range reqs {
					req := &fedstreampb.IngestRequest{Lines: lines, FirstLine: uint64(i*batch + 1)}
					if i == 0 {
						req.Query, req.Source = "ing", "events"
					}
					if err := stream.Send(req); err != nil {
						b.Fatal(err)
					}
				}
				if resp, err := stream.CloseAndRecv(); err != nil || resp.Accepted != uint64(b.N) {
					b.Fatalf("ingest: %v %v", resp, err)
				}
			case "IngestSession":
				cl, err := dataplane.NewIngestClient(ctx, dataplane.IngestClientConfig{Query: "ing", Source: "events", Producer: "bench",
					Resolve: func(context.Context) ([]dataplane.IngestCopy, error) {
						return []dataplane.IngestCopy{{TaskID: id, Addr: addr}}, nil
					},
					Conn: func(string) (grpc.ClientConnInterface, error) { return conn, nil }})
				if err != nil {
					b.Fatal(err)
				}
				for _, lines := range reqs {
					if err := cl.Send(ctx, lines); err != nil {
						b.Fatal(err)
					}
				}
				if res := cl.Result(); res.Accepted != uint64(b.N) {
					b.Fatalf("session accepted %d of %d", res.Accepted, b.N)
				}
				cl.Close()
			}
		})
	}
}
