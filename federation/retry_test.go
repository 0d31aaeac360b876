package federation

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"

	"github.com/fedstream/fedstream/federation/ledger"
	"github.com/fedstream/fedstream/fsm"
)

// errLostAnswer stands for the coordinator's "leadership lost while
// committing": the write may have committed, the caller cannot tell.
var errLostAnswer = errors.New("leadership lost while committing; the write may or may not have committed")

// lossyStore commits every command and loses the answer of those lose
// picks, as a leader that lost its leadership between the commit and
// its answer does.
type lossyStore struct {
	Store
	mu   sync.Mutex
	lose func(t fsm.MessageType, body any) bool
}

func (s *lossyStore) Apply(ctx context.Context, t fsm.MessageType, body any) (any, error) {
	v, err := s.Store.Apply(ctx, t, body)
	s.mu.Lock()
	lose := s.lose != nil && s.lose(t, body)
	s.mu.Unlock()
	if err == nil && lose {
		return nil, errLostAnswer
	}
	return v, err
}

// laggingStore reads stale (a frozen earlier state) until its next
// Apply, as a new leader that has not yet applied the entries its
// predecessor committed does.
type laggingStore struct {
	Store
	mu    sync.Mutex
	stale *fsm.StateStore
}

func (s *laggingStore) State() *fsm.StateStore {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stale != nil {
		return s.stale
	}
	return s.Store.State()
}

func (s *laggingStore) Apply(ctx context.Context, t fsm.MessageType, body any) (any, error) {
	v, err := s.Store.Apply(ctx, t, body)
	s.mu.Lock()
	s.stale = nil
	s.mu.Unlock()
	return v, err
}

// bufSink is a snapshot sink in memory.
type bufSink struct{ bytes.Buffer }

func (*bufSink) ID() string    { return "frozen" }
func (*bufSink) Cancel() error { return nil }
func (*bufSink) Close() error  { return nil }

// frozen is a copy of f's state as it is now.
func frozen(t *testing.T, f *fsm.FSM) *fsm.StateStore {
	t.Helper()
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var sink bufSink
	if err := snap.Persist(&sink); err != nil {
		t.Fatal(err)
	}
	snap.Release()
	g, err := fsm.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Restore(io.NopCloser(&sink.Buffer)); err != nil {
		t.Fatal(err)
	}
	return g.State()
}

// lossyNet delivers every message and loses the answer of those lose
// picks (the partner acted on it; the sender does not know).
type lossyNet struct {
	Transport
	lose func(to string, m Message) bool
}

func (n lossyNet) Call(ctx context.Context, to string, m Message) (Message, error) {
	ans, err := n.Transport.Call(ctx, to, m)
	if err == nil && n.lose != nil && n.lose(to, m) {
		return Message{}, errors.New("connection reset before the answer")
	}
	return ans, err
}

// proposeTo has a propose to b (pinned at a) and, with accept, b accept:
// the contract as a stored it.
func (f *fed) proposeTo(t *testing.T, a, b string, accept bool) ContractDoc {
	t.Helper()
	ctx := context.Background()
	f.pin(t, a, b)
	doc, err := f.orgs[a].Propose(ctx, proposal(b))
	if err != nil {
		t.Fatal(err)
	}
	if accept {
		if _, err := f.orgs[b].Accept(ctx, doc.Terms.ID); err != nil {
			t.Fatal(err)
		}
	}
	return doc
}

// storedState is o's contracts and ledger, to compare before and after.
func storedState(t *testing.T, o *Org) string {
	t.Helper()
	cs, err := o.Contracts()
	if err != nil {
		t.Fatal(err)
	}
	es, err := o.Entries()
	if err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal([]any{cs, es})
	return string(data)
}

// Once picks only the first call it is asked about.
func once[T any](pick func(T) bool) func(T) bool {
	var done bool
	return func(x T) bool {
		if done || !pick(x) {
			return false
		}
		done = true
		return true
	}
}

// A proposal retried with its request id after a lost answer (its write
// committed, or also its delivery to the partner) leaves one proposal at
// each org, and the retry answers the first; the same request id with
// other terms is refused, naming the id, and stores nothing.
func TestProposeRetriedWithRequestIDStoresOnce(t *testing.T) {
	cases := []struct {
		name      string
		loseWrite bool // the proposer's stored proposal's answer is lost
		loseSend  bool // the partner's answer to the proposal is lost
		// the retry reaches a leader that has not applied the first
		// write: the FSM's idempotency key answers it
		lagging bool
	}{
		{"answer of the write lost", true, false, false},
		{"answer of the partner lost", false, true, false},
		{"both", true, true, false},
		{"answer of the write lost, retry at a leader behind", true, false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			f := newFed(t, "alpha", "beta")
			a, b := f.orgs["alpha"], f.orgs["beta"]
			f.pin(t, "alpha", "beta")
			before := frozen(t, a.store.(*raftStore).f)
			ls := &lossyStore{Store: a.store}
			if tc.loseWrite {
				pick := once(func(c fsm.UpsertContractRequest) bool { return c.IdempotencyKey != "" })
				ls.lose = func(t fsm.MessageType, body any) bool {
					c, ok := body.(fsm.UpsertContractRequest)
					return t == fsm.UpsertContractType && ok && pick(c)
				}
			}
			a.store = ls
			if tc.loseSend {
				a.net = lossyNet{Transport: a.net, lose: func() func(string, Message) bool {
					pick := once(func(m Message) bool { return m.Kind == MsgPropose })
					return func(_ string, m Message) bool { return pick(m) }
				}()}
			}
			req := proposal("beta")
			req.RequestID = "r-1"
			if _, err := a.Propose(ctx, req); err == nil {
				t.Fatal("the first attempt's answer was not lost: the test tests nothing")
			}
			if tc.lagging {
				a.store = &laggingStore{Store: a.store, stale: before}
			}
			// Retried as a client does: each attempt later than the last,
			// so its record differs; each lost answer costs one.
			var doc ContractDoc
			var err error
			for attempt := 0; attempt < 3; attempt++ {
				f.now = f.now.Add(1)
				if doc, err = a.Propose(ctx, req); err == nil {
					break
				}
			}
			if err != nil {
				t.Fatalf("retries: %v", err)
			}
			for _, o := range []*Org{a, b} {
				cs, err := o.Contracts()
				if err != nil {
					t.Fatal(err)
				}
				if len(cs) != 1 || cs[0].Terms.ID != doc.Terms.ID || !sameSigned(cs[0].Signed, doc.Signed) {
					t.Fatalf("%s holds %d contracts (%+v), want the one answered (%s)", o.Name(), len(cs), cs, doc.Terms.ID)
				}
			}
			if c, _ := b.Contract(doc.Terms.ID); c.Status != StatusPending {
				t.Fatalf("beta: %s", c.Status)
			}
			// A third time, after the partner has it: the same answer.
			if again, err := a.Propose(ctx, req); err != nil || again.Terms.ID != doc.Terms.ID {
				t.Fatalf("third attempt: %v %v", again.Terms.ID, err)
			}
			// The same request id with other terms.
			other := req
			other.MaxLoad = 80
			if _, err := a.Propose(ctx, other); !errors.Is(err, fsm.ErrIdempotencyMismatch) || !strings.Contains(err.Error(), `"r-1"`) {
				t.Fatalf("other terms under the same request id: %v", err)
			}
			for _, o := range []*Org{a, b} {
				if cs, _ := o.Contracts(); len(cs) != 1 {
					t.Fatalf("%s holds %d contracts after a refused retry", o.Name(), len(cs))
				}
			}
			// Accepted, the retry still answers it (now active).
			if _, err := b.Accept(ctx, doc.Terms.ID); err != nil {
				t.Fatal(err)
			}
			if again, err := a.Propose(ctx, req); err != nil || again.Status != StatusActive {
				t.Fatalf("retry after the acceptance: %+v %v", again, err)
			}
		})
	}
}

// An acceptance whose local writes' answers were lost after the proposer
// recorded it is accepted again: the proposer answers that it has it
// (replayed), and the acceptor records it once.
func TestAcceptRetriedAfterLostAnswer(t *testing.T) {
	ctx := context.Background()
	f := newFed(t, "alpha", "beta")
	a, b := f.orgs["alpha"], f.orgs["beta"]
	doc := f.proposeTo(t, "alpha", "beta", false)
	ls := &lossyStore{Store: b.store}
	// The answer of its own ledger's contract record (after the proposer
	// recorded it).
	pick := once(func(e fsm.AppendLedgerEntryRequest) bool { return e.Entry.Kind == ledger.KindContract })
	ls.lose = func(t fsm.MessageType, body any) bool {
		e, ok := body.(fsm.AppendLedgerEntryRequest)
		return t == fsm.AppendLedgerEntryType && ok && pick(e)
	}
	b.store = ls
	if _, err := b.Accept(ctx, doc.Terms.ID); !errors.Is(err, errLostAnswer) {
		t.Fatalf("first acceptance: %v, want its lost answer", err)
	}
	if _, err := b.Accept(ctx, doc.Terms.ID); err != nil {
		t.Fatalf("acceptance again: %v", err)
	}
	for _, o := range []*Org{a, b} {
		c, _ := o.Contract(doc.Terms.ID)
		es, _ := o.Entries()
		n := 0
		for _, e := range es {
			if e.Record.Kind == ledger.KindContract {
				n++
			}
		}
		if c.Status != StatusActive || n != 1 {
			t.Fatalf("%s: contract %s, %d contract records in the ledger; want active, 1", o.Name(), c.Status, n)
		}
		if rep, err := o.Verify(); err != nil || !rep.Valid {
			t.Fatalf("%s: %+v %v", o.Name(), rep, err)
		}
	}
}

// Messages of a partner that is not a party, that carry a wrong or forged
// signature, or that were already received (the same signed message
// again) are refused with a reason that says so, and the receiver's
// contracts and ledger stay as they were.
func TestPartnerMessagesRefusedChangeNothing(t *testing.T) {
	ctx := context.Background()
	f := newFed(t, "alpha", "beta", "gamma")
	a, b, g := f.orgs["alpha"], f.orgs["beta"], f.orgs["gamma"]
	f.pin(t, "alpha", "beta")
	f.pin(t, "beta", "gamma")
	_, mallory, _ := ed25519.GenerateKey(rand.Reader)
	// The last message of each kind, as it went over the wire.
	sent := map[string]Message{}
	f.net.tamper = func(_ string, m *Message) {
		c := *m
		if m.Signed != nil {
			s := *m.Signed
			s.Signatures = append([]ledger.Signature(nil), s.Signatures...)
			c.Signed = &s
		}
		sent[m.Kind] = c
	}
	active, err := a.Propose(ctx, proposal("beta"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Accept(ctx, active.Terms.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := a.CoSign(ctx, ledger.KindMove, active.Terms.ID, map[string]string{"tasks": "q/f/0/0"}); err != nil {
		t.Fatal(err)
	}
	pending, err := a.Propose(ctx, proposal("beta"))
	if err != nil {
		t.Fatal(err)
	}
	f.net.tamper = nil

	// clone deep-copies m, then lets change edit the copy.
	clone := func(m Message, change func(*Message)) Message {
		var c Message
		data, _ := json.Marshal(m)
		_ = json.Unmarshal(data, &c)
		if change != nil {
			change(&c)
		}
		return c
	}
	resign := func(m *Message, org string, key ed25519.PrivateKey) {
		m.Signed.Signatures = []ledger.Signature{ledger.Sign(m.Signed.Record, org, key)}
	}
	cases := []struct {
		name     string
		to       *Org
		msg      Message
		want     string // in the refusal's reason
		replayed bool
	}{
		{"proposal replayed", b, sent[MsgPropose], "replayed", true},
		{"proposal signed by another key", b, clone(sent[MsgPropose], func(m *Message) {
			m.Signed.Record.ID = "c-other"
			resign(m, "alpha", mallory)
		}), "not signed by alpha", false},
		{"proposal sent by a non-party in alpha's name", b, clone(sent[MsgPropose], func(m *Message) { m.From = "gamma" }), "must be a contract from gamma", false},
		{"proposal of a known contract id with other terms", b, clone(sent[MsgPropose], func(m *Message) {
			m.Signed.Record.Fields["max_load"] = "800"
			resign(m, "alpha", a.SigningKey())
		}), "already exists here", false},
		{"acceptance replayed", a, clone(sent[MsgAccept], nil), "replayed", true},
		{"acceptance by a non-party", a, clone(sent[MsgAccept], func(m *Message) {
			m.From = "gamma"
			m.Key = ledger.EncodePublicKey(g.PublicKey())
		}), "is active with beta", false},
		{"acceptance with a forged signature", a, clone(sent[MsgAccept], func(m *Message) {
			m.Signed.Record = pending.Signed.Record
			m.Signed.Signatures = []ledger.Signature{pending.Signed.Signatures[0], ledger.Sign(pending.Signed.Record, "beta", mallory)}
		}), "beta's signature does not verify", false},
		{"countersigning replayed", b, clone(sent[MsgCoSign], nil), "replayed", true},
		{"countersigning asked by a non-party", b, clone(sent[MsgCoSign], func(m *Message) {
			m.From, m.Signed.Record.A, m.Signed.Record.ID = "gamma", "gamma", "move-from-gamma"
			resign(m, "gamma", g.SigningKey())
		}), "not a party to contract", false},
		{"countersigning with a forged signature", b, clone(sent[MsgCoSign], func(m *Message) {
			m.Signed.Record.ID = "move-forged"
			resign(m, "alpha", mallory)
		}), "signature", false},
		{"countersigning a record id again with other content", b, clone(sent[MsgCoSign], func(m *Message) {
			m.Signed.Record.Fields = map[string]string{"tasks": "q/f/1/0"}
			resign(m, "alpha", a.SigningKey())
		}), "already exists with other content", true},
		{"countersigning under a contract that does not exist", b, clone(sent[MsgCoSign], func(m *Message) {
			m.Signed.Record.Contract, m.Signed.Record.ID = "c-none", "move-none"
			resign(m, "alpha", a.SigningKey())
		}), "no such contract", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.msg.Kind == "" {
				t.Fatal("no message of that kind was sent")
			}
			before := storedState(t, tc.to)
			ans, err := tc.to.Receive(ctx, tc.msg)
			if err != nil {
				t.Fatalf("Receive: %v", err)
			}
			if ans.Kind != MsgRefused || !strings.Contains(ans.Reason, tc.want) || ans.Replayed != tc.replayed {
				t.Fatalf("answer %+v, want refused with %q (replayed %v)", ans, tc.want, tc.replayed)
			}
			if after := storedState(t, tc.to); after != before {
				t.Fatalf("%s's contracts or ledger changed:\nbefore %s\nafter  %s", tc.to.Name(), before, after)
			}
		})
	}
}

// An event co-signed again under its record id after a lost answer (the
// partner recorded it; this org's write, or the partner's answer, was
// lost) is recorded once in each ledger, both ledgers verify, and a
// termination leaves the contract terminated at both.
func TestCoSignRetriedWithRecordIDRecordsOnce(t *testing.T) {
	cases := []struct {
		name      string
		kind      string
		loseWrite bool // this org's append of the record: committed, answer lost
		loseSend  bool // the partner's answer: it recorded the event
	}{
		{"move, own write's answer lost", ledger.KindMove, true, false},
		{"move, partner's answer lost", ledger.KindMove, false, true},
		{"termination, own write's answer lost", ledger.KindTerminate, true, false},
		{"termination, partner's answer lost", ledger.KindTerminate, false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			f := newFed(t, "alpha", "beta")
			a, b := f.orgs["alpha"], f.orgs["beta"]
			id := f.proposeTo(t, "alpha", "beta", true).Terms.ID
			if tc.loseWrite {
				pick := once(func(e fsm.AppendLedgerEntryRequest) bool { return e.Entry.Kind == tc.kind })
				a.store = &lossyStore{Store: a.store, lose: func(t fsm.MessageType, body any) bool {
					e, ok := body.(fsm.AppendLedgerEntryRequest)
					return t == fsm.AppendLedgerEntryType && ok && pick(e)
				}}
			}
			if tc.loseSend {
				pick := once(func(m Message) bool { return m.Kind == MsgCoSign })
				a.net = lossyNet{Transport: a.net, lose: func(_ string, m Message) bool { return pick(m) }}
			}
			rid, err := NewRecordID(tc.kind)
			if err != nil {
				t.Fatal(err)
			}
			attempt := func() error {
				f.now = f.now.Add(1) // a retry is later: its record differs
				if tc.kind == ledger.KindTerminate {
					_, err := a.Terminate(ctx, id, "season over")
					return err
				}
				_, err := a.CoSignID(ctx, tc.kind, id, rid, map[string]string{"tasks": "q/f/0/0"})
				return err
			}
			if err := attempt(); err == nil {
				t.Fatal("the first attempt's answer was not lost: the test tests nothing")
			}
			if err := attempt(); err != nil {
				t.Fatalf("retry: %v", err)
			}
			var copies []ledger.Signed
			for _, o := range []*Org{a, b} {
				es, err := o.Entries()
				if err != nil {
					t.Fatal(err)
				}
				n := 0
				for _, e := range es {
					if e.Record.Kind == tc.kind {
						n++
						copies = append(copies, e.Signed)
					}
				}
				if n != 1 {
					t.Fatalf("%s records %d %s events, want 1", o.Name(), n, tc.kind)
				}
				if rep, err := o.Verify(); err != nil || !rep.Valid {
					t.Fatalf("%s: %+v %v", o.Name(), rep, err)
				}
				if c, _ := o.Contract(id); tc.kind == ledger.KindTerminate && c.Status != StatusTerminated {
					t.Fatalf("%s: contract %s", o.Name(), c.Status)
				}
			}
			if !sameSigned(copies[0], copies[1]) {
				t.Fatalf("the orgs recorded different records: %+v / %+v", copies[0], copies[1])
			}
		})
	}
}

// Answering or terminating a contract again once it is where the answer
// put it (a retry whose answer was lost) answers the contract and changes
// nothing; the proposer cannot accept or reject its own proposal.
func TestAnswersRetriedAfterTheyCompleted(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name   string
		answer func(a, b *Org, id string) (ContractDoc, error)
		want   string // status at both orgs
	}{
		{"accept", func(_, b *Org, id string) (ContractDoc, error) { return b.Accept(ctx, id) }, StatusActive},
		{"reject", func(_, b *Org, id string) (ContractDoc, error) { return b.Reject(ctx, id, "no") }, StatusRejected},
		{"terminate", func(a, b *Org, id string) (ContractDoc, error) {
			if _, err := b.Accept(ctx, id); err != nil {
				return ContractDoc{}, err
			}
			return a.Terminate(ctx, id, "done")
		}, StatusTerminated},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFed(t, "alpha", "beta")
			a, b := f.orgs["alpha"], f.orgs["beta"]
			id := f.proposeTo(t, "alpha", "beta", false).Terms.ID
			if _, err := tc.answer(a, b, id); err != nil {
				t.Fatal(err)
			}
			before := [2]string{storedState(t, a), storedState(t, b)}
			f.now = f.now.Add(1)
			again, err := tc.answer(a, b, id)
			if tc.name == "terminate" {
				// The setup's acceptance is made again too.
				again, err = a.Terminate(ctx, id, "done")
			}
			if err != nil || again.Status != tc.want {
				t.Fatalf("again: %s %v, want %s", again.Status, err, tc.want)
			}
			if after := [2]string{storedState(t, a), storedState(t, b)}; after != before {
				t.Fatalf("the retry changed something:\nbefore %v\nafter  %v", before, after)
			}
			if _, err := a.Accept(ctx, id); !errors.Is(err, ErrContractState) {
				t.Fatalf("the proposer accepting: %v", err)
			}
			if _, err := a.Reject(ctx, id, "x"); !errors.Is(err, ErrContractState) {
				t.Fatalf("the proposer rejecting: %v", err)
			}
		})
	}
}
