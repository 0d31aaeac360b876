package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/fedstream/fedstream/coordinator"
	"github.com/fedstream/fedstream/federation"
	"github.com/fedstream/fedstream/federation/ledger"
	"github.com/fedstream/fedstream/federation/loadmgr"
	"github.com/fedstream/fedstream/federation/mpa"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/tlsutil"
)

// The dev federation: three orgs in one process, each with its own CA,
// gossip key, Raft cluster and workers, in one federation pool, with
// contracts between every pair. alpha is made small (its load manager
// counts 0.05 cores of capacity, whatever its workers have), so the demo
// query, submitted to alpha, overloads it.

// devOrgs are the orgs of the dev federation; the demo runs in the first.
var devOrgs = []string{"alpha", "beta", "gamma"}

// devAlphaCores is the capacity alpha's load manager counts: small enough
// that the demo query's load exceeds it.
const devAlphaCores = 0.05

// devContract is one contract the dev federation sets up.
type devContract struct{ from, to, direction string }

// devContracts: alpha's tasks may run at beta and gamma; beta and gamma
// help each other.
var devContracts = []devContract{{"alpha", "beta", "out"}, {"alpha", "gamma", "out"}, {"beta", "gamma", "both"}}

// devLoadConfig is the load manager of org name in the dev federation:
// short periods so a newcomer sees moves within seconds, and every other
// dev org's proposals accepted automatically within the suggested prices.
// alphaCores, when above 0, replaces devAlphaCores.
func devLoadConfig(name string, alphaCores float64) loadmgr.Config {
	pmin, pmax := mpa.SuggestedPrices(mpa.DefaultUtilisation)
	var from []string
	for _, o := range devOrgs {
		if o != name {
			from = append(from, o)
		}
	}
	c := loadmgr.Config{Period: 2 * time.Second, SettleEvery: 30 * time.Second,
		AutoAccept: loadmgr.AutoAccept{From: from, PriceMinAtLeast: pmin, PriceMaxAtMost: pmax, MaxLoadAtMost: 4, MaxValidity: 48 * time.Hour}}
	if name == devOrgs[0] {
		c.Cores = devAlphaCores
		if alphaCores > 0 {
			c.Cores = alphaCores
		}
	}
	return c
}

// startDevFederation starts the three orgs; the caller waits for them
// (waitReady) and then sets up trust and contracts (devContractsUp).
func startDevFederation(ctx context.Context, o devOptions) ([]*devFederation, error) {
	keyring, err := newGossipKey()
	if err != nil {
		return nil, err
	}
	var orgs []*devFederation
	var join []string
	stopAll := func() { stopDevOrgs(orgs) }
	for _, name := range devOrgs {
		oo := o
		oo.org = name
		oo.dataDir = filepath.Join(o.dataDir, name)
		oo.federation = &coordinator.FederationConfig{Join: join, Keyring: keyring, Load: devLoadConfig(name, o.alphaCores)}
		d, err := startDev(ctx, oo)
		if err != nil {
			stopAll()
			return nil, fmt.Errorf("org %s: %w", name, err)
		}
		orgs = append(orgs, d)
		join = append(join, d.coords[0].FederationSerfAddr())
	}
	return orgs, nil
}

// devClient is an admin client of one dev org (dev mode: no tokens).
func (d *devFederation) client() *clientFlags {
	return &clientFlags{addr: d.coords[0].GRPCAddr(), timeout: 10 * time.Second, tls: clientTLS{dir: d.tlsDir}}
}

// orgKey waits for the org's identity in its ledger and returns it.
func (d *devFederation) orgKey(ctx context.Context, org string) (string, error) {
	for {
		key, err := func() (string, error) {
			conn, err := d.client().dial()
			if err != nil {
				return "", err
			}
			defer conn.Close()
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			resp, err := pb.NewFederationServiceClient(conn).ListLedger(cctx, &pb.ListLedgerRequest{})
			if err != nil {
				return "", err
			}
			es, err := ledger.UnmarshalEntries(resp.EntriesJson)
			if err != nil {
				return "", err
			}
			for _, e := range es {
				if e.Record.Kind == ledger.KindIdentity && e.Record.A == org {
					return e.Record.Fields[ledger.FieldKey], nil
				}
			}
			return "", errors.New("no identity yet")
		}()
		if err == nil {
			return key, nil
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("identity of %s: %w (last: %v)", org, ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// fedCall runs one federation service call on org d, retrying while the
// org or its partner is not reachable yet (a leader moments old, a
// partner not yet in the federation pool).
func (d *devFederation) fedCall(ctx context.Context, what string, call func(context.Context, pb.FederationServiceClient) error) error {
	var last error
	for {
		conn, err := d.client().dial()
		if err == nil {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err = call(cctx, pb.NewFederationServiceClient(conn))
			cancel()
			conn.Close()
		}
		if err == nil {
			return nil
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w (last: %v)", what, ctx.Err(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// devContractsUp does what the operators of the three orgs would: pin
// each other's signing key and CA, then propose the contracts, which the
// partners' auto-accept policies accept. It returns once every contract
// is active at its proposer.
func devContractsUp(ctx context.Context, orgs []*devFederation, log io.Writer) error {
	byName := map[string]*devFederation{}
	keys := map[string]string{}
	for i, d := range orgs {
		byName[devOrgs[i]] = d
		k, err := d.orgKey(ctx, devOrgs[i])
		if err != nil {
			return err
		}
		keys[devOrgs[i]] = k
	}
	pem := func(org string) ([]byte, error) {
		return os.ReadFile(filepath.Join(byName[org].tlsDir, tlsutil.CAFile))
	}
	pmin, pmax := mpa.SuggestedPrices(mpa.DefaultUtilisation)
	for _, c := range devContracts {
		for _, p := range [][2]string{{c.from, c.to}, {c.to, c.from}} {
			ca, err := pem(p[1])
			if err != nil {
				return err
			}
			err = byName[p[0]].fedCall(ctx, "pin "+p[1]+" at "+p[0], func(ctx context.Context, f pb.FederationServiceClient) error {
				_, err := f.PinKey(ctx, &pb.PinKeyRequest{Org: p[1], Key: keys[p[1]], CaPem: ca})
				return err
			})
			if err != nil {
				return err
			}
		}
		// One request id for every attempt: fedCall retries whatever
		// failed, and a retry of a proposal that was stored answers it
		// instead of storing a second one.
		requestID := fmt.Sprintf("devfed/%s/%s/%d", c.from, c.to, time.Now().UnixNano())
		err := byName[c.from].fedCall(ctx, "propose "+c.from+" -> "+c.to, func(ctx context.Context, f pb.FederationServiceClient) error {
			_, err := f.ProposeContract(ctx, &pb.ProposeContractRequest{To: c.to, PriceMin: pmin, PriceMax: pmax, MaxLoad: 2,
				ValidForMs: (24 * time.Hour).Milliseconds(), Direction: c.direction, NoticeMs: (10 * time.Second).Milliseconds(), RequestId: requestID})
			return err
		})
		if err != nil {
			return err
		}
	}
	// The partners accept in their next load period.
	for _, c := range devContracts {
		err := byName[c.from].fedCall(ctx, "contract "+c.from+" -> "+c.to+" active", func(ctx context.Context, f pb.FederationServiceClient) error {
			resp, err := f.ListContracts(ctx, &pb.ListContractsRequest{})
			if err != nil {
				return err
			}
			for _, b := range resp.ContractsJson {
				var doc federation.ContractDoc
				if err := json.Unmarshal(b, &doc); err != nil {
					return err
				}
				if doc.Status == federation.StatusActive && doc.Terms.Partner == c.to {
					return nil
				}
			}
			return errors.New("not active yet")
		})
		if err != nil {
			return err
		}
		fmt.Fprintf(log, "contract %s -> %s (%s) active: signed by both, in both ledgers\n", c.from, c.to, c.direction)
	}
	return nil
}

// setUpDevPartners waits for every org of the dev federation, sets up
// trust and contracts, and says how to watch the load move.
func setUpDevPartners(ctx context.Context, home *devFederation, partners []*devFederation, w io.Writer) error {
	all := append([]*devFederation{home}, partners...)
	for _, d := range all {
		if err := d.waitReady(ctx, d.client(), 2); err != nil {
			return fmt.Errorf("org %s: %w", d.org, err)
		}
	}
	if err := devContractsUp(ctx, all, w); err != nil {
		return err
	}
	a := home.client()
	fmt.Fprintf(w, `federation up: alpha's load manager counts %.2f cores, so the demo overloads it and it offers tasks to beta and gamma.
watch:  bin/fedstream load --addr %s --tls-dir %s
        bin/fedstream ledger list --addr %s --tls-dir %s
        bin/fedstream ledger verify --addr %s --tls-dir %s
        bin/fedstream members --addr %s --tls-dir %s
`, devAlphaCores, a.addr, a.tls.dir, a.addr, a.tls.dir, a.addr, a.tls.dir, a.addr, a.tls.dir)
	return nil
}

// stopDevOrgs stops the orgs at once: each waits for its coordinators to
// leave their pools, which need not wait for the other orgs.
func stopDevOrgs(orgs []*devFederation) {
	var wg sync.WaitGroup
	for _, d := range orgs {
		wg.Add(1)
		go func() { defer wg.Done(); d.stop() }()
	}
	wg.Wait()
}
