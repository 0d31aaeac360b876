package coordinator

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// The admin API as a register per query name, for porcupine. A name is
// absent, running or stopped; submit succeeds unless the query runs
// (AlreadyExists), stop succeeds unless it was never submitted (NotFound;
// stopping a stopped query is a no-op).
type qState int

const (
	qAbsent qState = iota
	qRunning
	qStopped
)

type adminOp struct {
	name   string
	submit bool // false: stop
}

type opResult int

const (
	resOK opResult = iota
	resExists
	resNotFound
	// resUnknown: no definite answer before the client gave up; the
	// operation may or may not have taken effect.
	resUnknown
)

func stepAdmin(st qState, op adminOp, res opResult) []qState {
	var next qState
	var out opResult
	switch {
	case op.submit && st == qRunning:
		next, out = st, resExists
	case op.submit:
		next, out = qRunning, resOK
	case st == qAbsent:
		next, out = st, resNotFound
	default:
		next, out = qStopped, resOK
	}
	switch res {
	case resUnknown:
		return []qState{st, next} // not applied, or applied
	case out:
		return []qState{next}
	}
	return nil
}

var adminModel = porcupine.NondeterministicModel{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byName := map[string][]porcupine.Operation{}
		var names []string
		for _, op := range history {
			n := op.Input.(adminOp).name
			if _, ok := byName[n]; !ok {
				names = append(names, n)
			}
			byName[n] = append(byName[n], op)
		}
		var out [][]porcupine.Operation
		for _, n := range names {
			out = append(out, byName[n])
		}
		return out
	},
	Init: func() []any { return []any{qAbsent} },
	Step: func(state, input, output any) []any {
		var out []any
		for _, s := range stepAdmin(state.(qState), input.(adminOp), output.(opResult)) {
			out = append(out, s)
		}
		return out
	},
	DescribeOperation: func(input, output any) string {
		op := input.(adminOp)
		verb := "stop"
		if op.submit {
			verb = "submit"
		}
		return fmt.Sprintf("%s(%s) -> %d", verb, op.name, output.(opResult))
	},
}

// TestAdminAPILinearizable records submits and stops of a few query names
// from several clients, each retried with its idempotency key across nodes
// until it gets a definite answer, while the test kills the leader, brings
// it back and partitions the new leader; porcupine checks the history.
func TestAdminAPILinearizable(t *testing.T) {
	t.Parallel()
	c, p := newPartitionableCluster(t, 3)
	c.leader()
	names := []string{"lin-a", "lin-b", "lin-c"}
	start := time.Now()
	now := func() int64 { return int64(time.Since(start)) }

	var (
		mu      sync.Mutex
		history []porcupine.Operation
	)
	clients := make([][]pb.AdminServiceClient, 4)
	for i := range clients {
		for n := range c.cfgs {
			clients[i] = append(clients[i], pb.NewAdminServiceClient(c.connAddr(c.cfgs[n].GRPCAddr, "")))
		}
	}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for ci := range clients {
		wg.Add(1)
		go func(ci int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(ci), 9))
			for seq := 0; ctx.Err() == nil; seq++ {
				op := adminOp{name: names[rng.IntN(len(names))], submit: rng.IntN(2) == 0}
				key := fmt.Sprintf("client%d-op%d", ci, seq)
				call := now()
				res := resUnknown
				deadline := time.Now().Add(6 * time.Second)
				for attempt := 0; res == resUnknown && time.Now().Before(deadline); attempt++ {
					cl := clients[ci][(ci+attempt)%len(clients[ci])]
					actx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
					var err error
					if op.submit {
						_, err = cl.SubmitQuery(actx, &pb.SubmitQueryRequest{Yaml: []byte(fmt.Sprintf(wordsQuery, op.name, 1)), IdempotencyKey: key})
					} else {
						_, err = cl.StopQuery(actx, &pb.StopQueryRequest{Name: op.name, IdempotencyKey: key})
					}
					cancel()
					switch status.Code(err) {
					case codes.OK:
						res = resOK
					case codes.AlreadyExists:
						res = resExists
					case codes.NotFound:
						res = resNotFound
					default: // unavailable, timed out, leadership lost: retry elsewhere
						time.Sleep(20 * time.Millisecond) // pacing between attempts, not synchronisation
					}
				}
				ret := now()
				if res == resUnknown {
					// It may take effect at any later time.
					ret = 1 << 62
				}
				mu.Lock()
				history = append(history, porcupine.Operation{ClientId: ci, Input: op, Call: call, Output: res, Return: ret})
				mu.Unlock()
			}
		}(ci)
	}

	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(history)
	}
	progress := func(what string, more int) {
		n := count()
		waitFor(t, 30*time.Second, what, func() bool { return count() >= n+more })
	}
	progress("operations before faults", 20)
	l := c.leader()
	c.stop(l) // kill the leader
	progress("operations after the leader kill", 20)
	c.start(l)
	// A coordinator that shut down left serf and was removed as a voter;
	// wait until it is one again, or partitioning a leader of two voters
	// would leave no quorum at all. Every node must hold the configuration
	// naming it: the leader lists it as soon as it appends the change, and
	// isolating the leader before a follower has it left that follower
	// with a configuration of two voters, one of them the isolated leader,
	// so nobody could be elected (seen on a loaded machine).
	waitFor(t, 30*time.Second, "the restarted coordinator a voter again on every node", func() bool {
		for i := range c.nodes {
			if len(c.raftServers(i)) != len(c.cfgs) {
				return false
			}
		}
		return true
	})
	nl := c.leader()
	p.isolate(c, nl, true) // partition the current leader
	progress("operations during the partition", 20)
	p.isolate(c, nl, false)
	progress("operations after healing", 20)
	stop()
	wg.Wait()

	definite := 0
	for _, op := range history {
		if op.Output.(opResult) != resUnknown {
			definite++
		}
	}
	t.Logf("%d operations (%d definite) in %v", len(history), definite, time.Since(start).Round(time.Millisecond))
	res, info := porcupine.CheckOperationsVerbose(adminModel.ToModel(), history, 20*time.Second)
	if res != porcupine.Ok {
		path := t.TempDir() + "/history.html"
		if err := porcupine.VisualizePath(adminModel.ToModel(), info, path); err == nil {
			t.Logf("visualization: %s", path)
		}
		t.Fatalf("admin API history is %s, want linearizable", res)
	}
	waitSameState(t, c, 30*time.Second)
}

// TestAdminModelRejectsAnomalies: the model refuses what a broken admin API
// would produce (so TestAdminAPILinearizable can fail).
func TestAdminModelRejectsAnomalies(t *testing.T) {
	t.Parallel()
	op := func(client int, name string, submit bool, call, ret int64, res opResult) porcupine.Operation {
		return porcupine.Operation{ClientId: client, Input: adminOp{name: name, submit: submit}, Call: call, Output: res, Return: ret}
	}
	bad := map[string][]porcupine.Operation{
		// A retried submit applied twice: the second says it exists
		// although nothing else ran.
		"retry applied twice": {op(0, "a", true, 0, 10, resExists)},
		// Two sequential submits both succeed without a stop between.
		"double submit": {op(0, "a", true, 0, 10, resOK), op(1, "a", true, 20, 30, resOK)},
		// A stale read of absence after a completed submit.
		"lost write": {op(0, "a", true, 0, 10, resOK), op(1, "a", false, 20, 30, resNotFound)},
	}
	for name, h := range bad {
		if porcupine.CheckOperations(adminModel.ToModel(), h) {
			t.Errorf("%s: accepted as linearizable", name)
		}
	}
	good := []porcupine.Operation{
		op(0, "a", true, 0, 10, resOK), op(1, "a", true, 5, 15, resExists),
		op(2, "a", false, 20, 30, resOK), op(0, "a", true, 25, 1<<62, resUnknown),
		op(1, "a", false, 40, 50, resOK),
	}
	if !porcupine.CheckOperations(adminModel.ToModel(), good) {
		t.Error("a linearizable history was refused")
	}
}
