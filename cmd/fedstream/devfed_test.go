package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/logging"
	"github.com/fedstream/fedstream/federation/ledger"
	"github.com/fedstream/fedstream/federation/loadmgr"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// The dev federation starts: three orgs of 3 coordinators and 2 workers,
// contracts proposed and auto-accepted between them, each org's ledger
// verifies, and once the demo runs in alpha its load exceeds its capacity
// and the load manager moves tasks to partners (cross-org migration), each
// move recorded, co-signed, in the ledgers, which still verify.
func TestDevFederationStarts(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 9 coordinators and 6 workers")
	}
	start := time.Now()
	step := func(what string) { t.Logf("%5.1fs %s", time.Since(start).Seconds(), what) }
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var level slog.LevelVar
	level.Set(slog.LevelError + 4) // a loaded machine makes gossip complain; not the test's subject
	logger := logging.NewLeveled(os.Stderr, &level, false)
	// alpha counts even fewer cores than in `fedstream dev`: the demo's
	// CPU use depends on the machine, and this test needs alpha overloaded
	// whatever it is (on a loaded machine the demo measured 0.03 cores,
	// under dev's 0.04 of capacity).
	orgs, err := startDevFederation(ctx, devOptions{coordinators: 3, workers: 2, dataDir: t.TempDir(), logger: logger, noHTTP: true, alphaCores: 0.005})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		stopDevOrgs(orgs)
		step("stopped")
	}()
	step("started")
	for _, d := range orgs {
		if err := d.waitReady(ctx, d.client(), 2); err != nil {
			t.Fatal(err)
		}
		step(d.org + " ready")
	}
	if err := setUpDevPartners(ctx, orgs[0], orgs[1:], io.Discard); err != nil {
		t.Fatal(err)
	}
	step("contracts active")
	for i, d := range orgs {
		conn, err := d.client().dial()
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		resp, err := pb.NewFederationServiceClient(conn).VerifyLedger(ctx, &pb.VerifyLedgerRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var rep ledger.Report
		if err := json.Unmarshal(resp.ReportJson, &rep); err != nil || !rep.Valid || rep.Entries < 3 {
			t.Fatalf("%s's ledger: %+v %v", devOrgs[i], rep, err)
		}
	}
	step("ledgers verified")
	// The demo overloads alpha; its load manager offers tasks to partners,
	// which accept.
	f := orgs[0].client()
	c, cctx, done, err := f.admin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.SubmitQuery(cctx, &pb.SubmitQueryRequest{Yaml: demoQuery, Filename: "demo-netmon.yaml", IdempotencyKey: "devfed-test"})
	done()
	if err != nil {
		t.Fatal(err)
	}
	conn, err := f.dial()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var st loadmgr.Status
	for {
		resp, err := pb.NewLoadServiceClient(conn).LoadStatus(ctx, &pb.LoadStatusRequest{})
		if err == nil && resp.Enabled {
			if err := json.Unmarshal(resp.StatusJson, &st); err != nil {
				t.Fatal(err)
			}
			last := strings.Join(st.Last, "\n")
			if st.Moves > 0 && len(st.Out) > 0 {
				step("moved: " + last)
				break
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("alpha's load manager never moved a task to a partner: %+v (last err %v)", st, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
	// Every org's ledger still verifies, and alpha's records the move.
	for i, d := range orgs {
		conn, err := d.client().dial()
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		resp, err := pb.NewFederationServiceClient(conn).VerifyLedger(ctx, &pb.VerifyLedgerRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var rep ledger.Report
		if err := json.Unmarshal(resp.ReportJson, &rep); err != nil || !rep.Valid {
			t.Fatalf("%s's ledger after the moves: %+v %v", devOrgs[i], rep, err)
		}
	}
	lresp, err := pb.NewFederationServiceClient(conn).ListLedger(ctx, &pb.ListLedgerRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var entries []ledger.Entry
	if err := json.Unmarshal(lresp.EntriesJson, &entries); err != nil {
		t.Fatal(err)
	}
	moves := 0
	for _, e := range entries {
		if e.Record.Kind == "move" {
			moves++
		}
	}
	if moves == 0 {
		t.Fatalf("alpha's ledger has no move record: %d entries", len(entries))
	}
	step("ledgers verified after the moves")
}
