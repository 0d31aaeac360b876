// Package federation is what one org does in a federation of orgs: its
// signing identity, the partner keys it pinned, contracts proposed,
// accepted, rejected and terminated, and the co-signed ledger of contracts,
// moves, returns and settlements kept in the org's own Raft state.
//
// An Org talks to partners only through a Transport (one request, one
// answer), so the same state machine runs between two in-process orgs in
// tests and, later, over the cross-org gRPC connection. Every state change
// is a Raft command of the org (UpsertContract, AppendLedgerEntry); the
// Org must run on the org's leader, which serialises its ledger appends.
package federation

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fedstream/fedstream/federation/ledger"
	"github.com/fedstream/fedstream/federation/mpa"
	"github.com/fedstream/fedstream/fsm"
)

// Errors a caller (and the CLI) can tell apart.
var (
	// ErrUnknownOrg: no route to an org of that name.
	ErrUnknownOrg = errors.New("unknown org")
	// ErrNoPinnedKey: the partner's signing key is not pinned yet.
	ErrNoPinnedKey = errors.New("no pinned signing key for org")
	// ErrKeyMismatch: a key differs from the one pinned (or from this
	// org's own identity).
	ErrKeyMismatch = errors.New("signing key differs from the pinned one")
	// ErrNoContract: no contract with that id.
	ErrNoContract = errors.New("no such contract")
	// ErrContractState: the contract is not in a state that allows the
	// operation (accepting an active one, terminating a proposal...).
	ErrContractState = errors.New("contract is not in a state that allows this")
	// ErrRefused: the partner refused a request; the message says why.
	ErrRefused = errors.New("refused by partner")
	// ErrReplayed: a partner's signed message that was already received
	// and acted on (the same proposal, acceptance or countersigned record
	// again); it changes nothing.
	ErrReplayed = errors.New("replayed: this signed message was already received")
	// ErrDuplicateRecord: a record whose id is already in the ledger with
	// other content.
	ErrDuplicateRecord = errors.New("a ledger record with this id already exists with other content")
)

// Contract statuses.
const (
	// StatusProposed: this org proposed it and waits for the partner.
	StatusProposed = "proposed"
	// StatusPending: a partner proposed it; an operator accepts or rejects.
	StatusPending = "pending"
	// StatusActive: both signed; in the ledger of both.
	StatusActive = "active"
	// StatusRejected: the partner (or this org) rejected it.
	StatusRejected = "rejected"
	// StatusTerminated: ended early by either party, recorded in both
	// ledgers.
	StatusTerminated = "terminated"
)

// Store is the org's replicated state as the federation uses it: apply a
// command through Raft (on the leader) and read the state.
type Store interface {
	Apply(ctx context.Context, t fsm.MessageType, body any) (any, error)
	State() *fsm.StateStore
}

// Transport carries one request to a partner org and brings back its
// answer. Known reports whether org can be reached at all.
type Transport interface {
	Call(ctx context.Context, to string, m Message) (Message, error)
	Known(org string) bool
}

// Message is one request or answer between orgs.
type Message struct {
	Kind string `json:"kind"`
	From string `json:"from"`
	// Signed is the record the message is about with the signatures so
	// far.
	Signed *ledger.Signed `json:"signed,omitempty"`
	// Key is the sender's public signing key (EncodePublicKey), sent with
	// proposals and acceptances so the partner can pin it.
	Key string `json:"key,omitempty"`
	// Reason explains a rejection or a refusal.
	Reason string `json:"reason,omitempty"`
	// Replayed marks a refusal of a message already received and acted
	// on: the receiver holds exactly the proposal or acceptance it
	// carries (ErrReplayed), or, for a countersigning request, a record
	// of that kind and id, which Signed then carries (ErrReplayed if it
	// is the same, ErrDuplicateRecord if not). A sender that sends its
	// message again on purpose (a retried Propose, Accept or CoSignID)
	// takes it as delivered, or the record as the one its first attempt
	// made once it verifies. Older builds never set it.
	Replayed bool `json:"replayed,omitempty"`
	// Body carries the request or answer of a message kind that is not
	// about a ledger record (cross-org migration, handled by the
	// coordinator: see IsMigration).
	Body json.RawMessage `json:"body,omitempty"`
	// Load carries the load manager's quotes and offers (MsgQuote,
	// MsgOffer) and their answers.
	Load *LoadMessage `json:"load,omitempty"`
}

// LoadMessage is the body of the load manager's messages between two
// contract partners. An owner asks for a quote (its marginal cost and
// migration cost), the partner answers with its marginal cost, the price
// it would settle and the load it would take at that price; the owner
// then offers tasks at a price, and the partner answers with the tasks it
// accepts.
type LoadMessage struct {
	Contract      string     `json:"contract"`
	OwnerMarginal float64    `json:"owner_marginal,omitempty"`
	MigrationCost float64    `json:"migration_cost,omitempty"`
	HostMarginal  float64    `json:"host_marginal,omitempty"`
	Room          float64    `json:"room,omitempty"`
	Price         float64    `json:"price,omitempty"`
	Tasks         []mpa.Task `json:"tasks,omitempty"`
}

// LoadHandler answers a partner's quote and offer messages: the org's
// load manager. doc is the active contract the message names, already
// checked to be one between this org and m.From.
type LoadHandler interface {
	ReceiveLoad(ctx context.Context, doc ContractDoc, m Message) (Message, error)
}

// IsMigration reports whether a message kind belongs to cross-org
// migration (the coordinator handles those, not Org.Receive).
func IsMigration(kind string) bool { return strings.HasPrefix(kind, "xorg-") }

// Message kinds.
const (
	MsgPropose = "propose" // Signed: the contract record signed by the proposer
	MsgAccept  = "accept"  // Signed: the contract record signed by both
	MsgReject  = "reject"  // Signed: the contract record (unsigned by the sender)
	MsgCoSign  = "cosign"  // Signed: a record of an active contract signed by its A
	MsgQuote   = "quote"   // Load: contract, owner's marginal and migration cost; answered MsgOK with the partner's quote
	MsgOffer   = "offer"   // Load: contract, price and tasks offered; answered MsgOK with the tasks accepted
	MsgOK      = "ok"      // answer; Signed carries the partner's countersignature for MsgCoSign
	MsgRefused = "refused" // answer; Reason says why
)

// ContractDoc is the contract as stored in fsm.Contract.Body.
type ContractDoc struct {
	Terms  Terms         `json:"terms"`
	Status string        `json:"status"`
	Signed ledger.Signed `json:"signed"`
	// Reason of a rejection.
	Reason string `json:"reason,omitempty"`
	// PartnerKey is the key the partner presented with a proposal it
	// made, pinned when this org accepts.
	PartnerKey string `json:"partner_key,omitempty"`
	// RequestID and RequestHash are those of the request that proposed
	// it here (ProposeRequest.RequestID), so that a retry finds it.
	RequestID   string `json:"request_id,omitempty"`
	RequestHash string `json:"request_hash,omitempty"`
}

// Terms are a contract's terms in their stored and signed form.
type Terms struct {
	ID        string        `json:"id"`
	Proposer  string        `json:"proposer"`
	Partner   string        `json:"partner"`
	PriceMin  float64       `json:"price_min"`
	PriceMax  float64       `json:"price_max"`
	MaxLoad   float64       `json:"max_load"`
	Direction mpa.Direction `json:"direction"`
	Tasks     []string      `json:"tasks,omitempty"`
	NotBefore time.Time     `json:"not_before"`
	NotAfter  time.Time     `json:"not_after"`
	Notice    time.Duration `json:"notice"`
}

// MPA converts to the decision rules' terms.
func (t Terms) MPA() mpa.Terms {
	return mpa.Terms{ID: t.ID, Proposer: t.Proposer, Partner: t.Partner, PriceMin: t.PriceMin, PriceMax: t.PriceMax,
		MaxLoad: t.MaxLoad, Direction: t.Direction, Classes: t.Tasks, NotBefore: t.NotBefore, NotAfter: t.NotAfter, Notice: t.Notice}
}

// fields is the terms' form inside the signed record.
func (t Terms) fields() map[string]string {
	f := func(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }
	return map[string]string{
		"price_min": f(t.PriceMin), "price_max": f(t.PriceMax), "max_load": f(t.MaxLoad),
		"direction": string(t.Direction), "tasks": strings.Join(t.Tasks, ","),
		"not_before": t.NotBefore.UTC().Format(time.RFC3339Nano), "not_after": t.NotAfter.UTC().Format(time.RFC3339Nano),
		"notice": t.Notice.String(),
	}
}

// ProposeRequest is what an operator proposes.
type ProposeRequest struct {
	To        string
	PriceMin  float64
	PriceMax  float64
	MaxLoad   float64
	ValidFor  time.Duration
	Direction string
	Tasks     []string
	Notice    time.Duration
	// RequestID, chosen by the client and the same on each retry of one
	// proposal, makes Propose idempotent: the proposal is stored under
	// this id with a hash of the request (fsm.UpsertContractRequest), so
	// a retry after a lost answer (the write may have committed) stores
	// nothing new and answers the first proposal, and the same id with
	// other terms is refused (fsm.ErrIdempotencyMismatch). "" proposes
	// without one.
	//
	// Replication: a retry that finds the first proposal in the state
	// writes nothing, so every build agrees. Only a retry that reaches a
	// new leader before it applied the first write proposes a second
	// upsert, which the key makes a no-op here; a node of a build without
	// the key (the fields are optional, the protocol version is the same)
	// would apply it as a second contract, so during a rolling upgrade
	// that case can leave such nodes with an extra proposed contract.
	RequestID string
}

// hash fingerprints the request as the client made it (RequestID aside):
// what a retry must repeat.
func (r ProposeRequest) hash(dir mpa.Direction) string {
	canon, _ := json.Marshal([]any{r.To, r.PriceMin, r.PriceMax, r.MaxLoad, int64(r.ValidFor), string(dir), r.Tasks, int64(r.Notice)})
	sum := sha256.Sum256(canon)
	return hex.EncodeToString(sum[:16])
}

// proposeKey is the FSM idempotency key of a proposal's request id,
// apart from other commands' keys.
func proposeKey(requestID string) string { return "contract-propose/" + requestID }

// Org is one org's federation agent.
type Org struct {
	name  string
	key   ed25519.PrivateKey
	store Store
	net   Transport
	now   func() time.Time

	// mu serialises ledger appends and contract transitions, so the
	// chain read before an append is still the head when it applies.
	mu sync.Mutex

	// load answers quotes and offers; nil refuses them.
	load atomic.Pointer[LoadHandler]
}

// SetLoadHandler installs the org's load manager as the receiver of
// partners' quotes and offers (nil: refuse them).
func (o *Org) SetLoadHandler(h LoadHandler) {
	if h == nil {
		o.load.Store(nil)
		return
	}
	o.load.Store(&h)
}

// Call sends a load manager's message to partner org and returns its
// answer; a refusal comes back as an error wrapping ErrRefused.
func (o *Org) Call(ctx context.Context, to string, m Message) (Message, error) {
	m.From = o.name
	ans, err := o.net.Call(ctx, to, m)
	if err != nil {
		return Message{}, err
	}
	if ans.Kind != MsgOK {
		return Message{}, fmt.Errorf("%w: %s: %s", ErrRefused, to, ans.Reason)
	}
	return ans, nil
}

// Now is the org's clock.
func (o *Org) Now() time.Time { return o.now() }

// NewOrg returns the agent of org name with signing key key. now may be
// nil (time.Now).
func NewOrg(name string, key ed25519.PrivateKey, store Store, net Transport, now func() time.Time) *Org {
	if now == nil {
		now = time.Now
	}
	return &Org{name: name, key: key, store: store, net: net, now: now}
}

// SetKey replaces the signing key, for a coordinator that fetched the
// org's key from another coordinator after starting with one of its own.
func (o *Org) SetKey(key ed25519.PrivateKey) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.key = key
}

// IdentityKey returns the public key the org's ledger records as its
// identity; ok is false while there is none.
func (o *Org) IdentityKey() (key ed25519.PublicKey, ok bool, err error) {
	es, err := o.entries()
	if err != nil {
		return nil, false, err
	}
	for _, e := range es {
		if e.Record.Kind == ledger.KindIdentity && e.Record.A == o.name {
			k, err := ledger.DecodePublicKey(e.Record.Fields[ledger.FieldKey])
			if err != nil {
				return nil, false, err
			}
			return k, true, nil
		}
	}
	return nil, false, nil
}

// Name is the org's name.
func (o *Org) Name() string { return o.name }

// PublicKey is the org's public signing key.
func (o *Org) PublicKey() ed25519.PublicKey { return o.signingKey().Public().(ed25519.PublicKey) }

// SigningKey is the org's private signing key, for handing it to another
// coordinator of the org.
func (o *Org) SigningKey() ed25519.PrivateKey { return o.signingKey() }

// signingKey reads the key; callers that hold o.mu read o.key directly.
func (o *Org) signingKey() ed25519.PrivateKey {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.key
}

// EnsureIdentity writes the org's identity record (its public key) as the
// first ledger entry when the ledger is empty, and checks that an existing
// identity is this key: a coordinator started with another org's data
// directory, or a lost key file, must not sign for the org.
func (o *Org) EnsureIdentity(ctx context.Context) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	es, err := o.entries()
	if err != nil {
		return err
	}
	mine := ledger.EncodePublicKey(o.key.Public().(ed25519.PublicKey))
	for _, e := range es {
		if e.Record.Kind == ledger.KindIdentity && e.Record.A == o.name {
			if e.Record.Fields[ledger.FieldKey] != mine {
				return fmt.Errorf("%w: the org's ledger names identity key %s, this coordinator holds %s", ErrKeyMismatch, e.Record.Fields[ledger.FieldKey], mine)
			}
			return nil
		}
	}
	r := ledger.Record{Kind: ledger.KindIdentity, ID: "identity-" + o.name, A: o.name, Time: o.now().UTC(), Fields: map[string]string{ledger.FieldKey: mine}}
	return o.appendLocked(ctx, ledger.Signed{Record: r, Signatures: []ledger.Signature{ledger.Sign(r, o.name, o.key)}})
}

// Keys returns the keyring of this org's ledger: its identity and every
// pinned partner key.
func (o *Org) Keys() (ledger.Keyring, error) {
	es, err := o.entries()
	if err != nil {
		return nil, err
	}
	return keysOf(es), nil
}

func keysOf(es []ledger.Entry) ledger.Keyring {
	keys := ledger.Keyring{}
	for _, e := range es {
		var org string
		switch e.Record.Kind {
		case ledger.KindIdentity:
			org = e.Record.A
		case ledger.KindPin:
			org = e.Record.B
		default:
			continue
		}
		if k, err := ledger.DecodePublicKey(e.Record.Fields[ledger.FieldKey]); err == nil {
			keys[org] = k
		}
	}
	return keys
}

// Pin records partner org's public signing key in the ledger. Pinning the
// same key again does nothing; a different key is refused (a key change
// needs a new identity, which this build does not support).
func (o *Org) Pin(ctx context.Context, org string, key ed25519.PublicKey) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.pinLocked(ctx, org, key)
}

func (o *Org) pinLocked(ctx context.Context, org string, key ed25519.PublicKey) error {
	if org == o.name {
		return fmt.Errorf("%w: cannot pin a key for this org itself (%s)", ErrKeyMismatch, org)
	}
	if len(key) != ed25519.PublicKeySize {
		return fmt.Errorf("%w: key for %s is %d bytes, want %d", ErrKeyMismatch, org, len(key), ed25519.PublicKeySize)
	}
	keys, err := o.Keys()
	if err != nil {
		return err
	}
	if k, ok := keys[org]; ok {
		if k.Equal(key) {
			return nil
		}
		return fmt.Errorf("%w: %s presents %s, pinned %s", ErrKeyMismatch, org, ledger.EncodePublicKey(key), ledger.EncodePublicKey(k))
	}
	r := ledger.Record{Kind: ledger.KindPin, ID: "pin-" + org, A: o.name, B: org, Time: o.now().UTC(), Fields: map[string]string{ledger.FieldKey: ledger.EncodePublicKey(key)}}
	return o.appendLocked(ctx, ledger.Signed{Record: r, Signatures: []ledger.Signature{ledger.Sign(r, o.name, o.key)}})
}

// Propose validates terms, signs the contract, stores it as proposed and
// sends it to the partner.
func (o *Org) Propose(ctx context.Context, req ProposeRequest) (ContractDoc, error) {
	dir, err := mpa.ParseDirection(req.Direction)
	if err != nil {
		return ContractDoc{}, err
	}
	if req.ValidFor <= 0 {
		return ContractDoc{}, fmt.Errorf("%w: validity %s: a contract must be valid for a positive duration (it would be expired on arrival)", mpa.ErrBadTerms, req.ValidFor)
	}
	if req.To == o.name {
		return ContractDoc{}, fmt.Errorf("%w: an org cannot contract with itself (%s)", mpa.ErrBadTerms, req.To)
	}
	now := o.now().UTC()
	id, err := newID()
	if err != nil {
		return ContractDoc{}, err
	}
	t := Terms{ID: id, Proposer: o.name, Partner: req.To, PriceMin: req.PriceMin, PriceMax: req.PriceMax, MaxLoad: req.MaxLoad,
		Direction: dir, Tasks: req.Tasks, NotBefore: now, NotAfter: now.Add(req.ValidFor), Notice: req.Notice}
	if err := t.MPA().Validate(); err != nil {
		return ContractDoc{}, err
	}
	if !o.net.Known(req.To) {
		return ContractDoc{}, fmt.Errorf("%w %q: it is not a member of the federation this org can reach", ErrUnknownOrg, req.To)
	}
	keys, err := o.Keys()
	if err != nil {
		return ContractDoc{}, err
	}
	if _, ok := keys[req.To]; !ok {
		return ContractDoc{}, fmt.Errorf("%w %q: pin its key first", ErrNoPinnedKey, req.To)
	}
	r := contractRecord(t, now)
	doc := ContractDoc{Terms: t, Status: StatusProposed, Signed: ledger.Signed{Record: r, Signatures: []ledger.Signature{ledger.Sign(r, o.name, o.signingKey())}}}
	var key, hash string
	if req.RequestID != "" {
		key, hash = proposeKey(req.RequestID), req.hash(dir)
		doc.RequestID, doc.RequestHash = req.RequestID, hash
	}
	// A retry finds the first proposal in the state when it was applied
	// here, and writes nothing: every build agrees on that. The FSM's key
	// covers a first write not applied here yet (a new leader that has
	// not caught up).
	o.mu.Lock()
	stored, err := o.proposedFor(req.RequestID, hash)
	if err == nil && stored == "" {
		stored, err = o.putContractKeyed(ctx, doc, key, hash)
	}
	o.mu.Unlock()
	if err != nil {
		if errors.Is(err, fsm.ErrIdempotencyMismatch) {
			return ContractDoc{}, fmt.Errorf("proposal request id %q was used for a proposal with other terms: %w", req.RequestID, err)
		}
		return ContractDoc{}, err
	}
	retried := stored != doc.Terms.ID
	if retried {
		// A retry of a proposal stored before: answer that one.
		if doc, err = o.contract(stored); err != nil {
			return ContractDoc{}, fmt.Errorf("proposal request id %q: the proposal stored for it: %w", req.RequestID, err)
		}
		if doc.Status != StatusProposed {
			return doc, nil // the partner answered it already
		}
		id = doc.Terms.ID
	}
	signed := doc.Signed
	ans, err := o.net.Call(ctx, req.To, Message{Kind: MsgPropose, From: o.name, Signed: &signed, Key: ledger.EncodePublicKey(o.PublicKey())})
	if err != nil {
		return doc, fmt.Errorf("contract %s stored as proposed, but sending it to %s failed: %w", id, req.To, err)
	}
	if ans.Kind != MsgOK && !(retried && ans.Replayed) {
		return doc, fmt.Errorf("%w: %s: %s", ErrRefused, req.To, ans.Reason)
	}
	return doc, nil
}

func contractRecord(t Terms, at time.Time) ledger.Record {
	return ledger.Record{Kind: ledger.KindContract, ID: t.ID, Contract: t.ID, A: t.Proposer, B: t.Partner, Time: at, Fields: t.fields()}
}

func newID() (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("contract id: %w", err)
	}
	return "c-" + hex.EncodeToString(b[:]), nil
}

// Accept countersigns a pending contract: the proposer's key is pinned
// (if it was not), the proposer records the contract in its ledger, then
// this org does.
func (o *Org) Accept(ctx context.Context, id string) (ContractDoc, error) {
	o.mu.Lock()
	doc, err := o.contract(id)
	if err == nil && doc.Status == StatusActive && doc.Terms.Partner == o.name {
		// Accepted here before: a retry whose answer was lost.
		o.mu.Unlock()
		return doc, nil
	}
	if err == nil && doc.Status != StatusPending {
		err = fmt.Errorf("%w: contract %s is %s; only a pending contract (proposed by the partner) can be accepted", ErrContractState, id, doc.Status)
	}
	if err == nil && !o.now().Before(doc.Terms.NotAfter) {
		err = fmt.Errorf("%w: contract %s expired at %s", mpa.ErrBadTerms, id, doc.Terms.NotAfter.Format(time.RFC3339))
	}
	var key ed25519.PublicKey
	if err == nil {
		key, err = ledger.DecodePublicKey(doc.PartnerKey)
	}
	if err == nil {
		err = o.pinLocked(ctx, doc.Terms.Proposer, key)
	}
	o.mu.Unlock()
	if err != nil {
		return ContractDoc{}, err
	}
	signed := doc.Signed
	signed.Signatures = append(append([]ledger.Signature(nil), signed.Signatures...), ledger.Sign(signed.Record, o.name, o.signingKey()))
	ans, err := o.net.Call(ctx, doc.Terms.Proposer, Message{Kind: MsgAccept, From: o.name, Signed: &signed, Key: ledger.EncodePublicKey(o.PublicKey())})
	if err != nil {
		return ContractDoc{}, fmt.Errorf("sending the acceptance of %s to %s: %w (still pending; accept again)", id, doc.Terms.Proposer, err)
	}
	// Replayed: an acceptance sent before (ed25519 signs alike, so a
	// retried Accept sends the same message) that the proposer recorded,
	// and this org did not, its write lost with its leadership: record it
	// now.
	if ans.Kind != MsgOK && !ans.Replayed {
		return ContractDoc{}, fmt.Errorf("%w: %s: %s", ErrRefused, doc.Terms.Proposer, ans.Reason)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if err := o.appendLocked(ctx, signed); err != nil {
		return ContractDoc{}, err
	}
	doc.Status, doc.Signed = StatusActive, signed
	return doc, o.putContract(ctx, doc)
}

// Reject declines a pending contract and tells the proposer.
func (o *Org) Reject(ctx context.Context, id, reason string) (ContractDoc, error) {
	o.mu.Lock()
	doc, err := o.contract(id)
	if err == nil && doc.Status == StatusRejected && doc.Terms.Partner == o.name {
		// Rejected here before: a retry whose answer was lost. The
		// proposer is told again (it may not have been).
		o.mu.Unlock()
		return o.tellRejected(ctx, doc)
	}
	if err == nil && doc.Status != StatusPending {
		err = fmt.Errorf("%w: contract %s is %s; only a pending contract can be rejected", ErrContractState, id, doc.Status)
	}
	if err == nil {
		doc.Status, doc.Reason = StatusRejected, reason
		err = o.putContract(ctx, doc)
	}
	o.mu.Unlock()
	if err != nil {
		return ContractDoc{}, err
	}
	return o.tellRejected(ctx, doc)
}

// tellRejected tells the proposer of doc that this org rejected it.
func (o *Org) tellRejected(ctx context.Context, doc ContractDoc) (ContractDoc, error) {
	signed := doc.Signed
	if _, err := o.net.Call(ctx, doc.Terms.Proposer, Message{Kind: MsgReject, From: o.name, Signed: &signed, Reason: doc.Reason}); err != nil {
		return doc, fmt.Errorf("rejected here, but telling %s failed: %w", doc.Terms.Proposer, err)
	}
	return doc, nil
}

// Terminate ends an active contract early: both orgs sign a terminate
// record and record it.
func (o *Org) Terminate(ctx context.Context, id, reason string) (ContractDoc, error) {
	doc, err := o.Contract(id)
	if err != nil {
		return ContractDoc{}, err
	}
	if doc.Status == StatusTerminated {
		// Retried after its answer was lost, or terminated by the
		// partner: the contract is where the caller wants it.
		return doc, nil
	}
	if doc.Status != StatusActive {
		return ContractDoc{}, fmt.Errorf("%w: contract %s is %s; only an active contract can be terminated", ErrContractState, id, doc.Status)
	}
	// One termination per contract: its record id is the contract's, so
	// a retry (its first attempt recorded at the partner, its answer
	// lost) is the same record, which CoSignID completes.
	if _, err := o.CoSignID(ctx, ledger.KindTerminate, id, "terminate-"+id, map[string]string{"reason": reason}); err != nil {
		return ContractDoc{}, err
	}
	return o.Contract(id)
}

// NewRecordID returns a new id for a record of kind, for a caller of
// CoSignID that will retry it.
func NewRecordID(kind string) (string, error) {
	rid, err := newID()
	if err != nil {
		return "", err
	}
	return kind + "-" + strings.TrimPrefix(rid, "c-"), nil
}

// CoSign records an event of an active contract (a move, a return, a
// settlement, a termination) in both orgs' ledgers: this org signs it as
// party A, the partner checks and countersigns it and records it, then
// this org records it. It returns the co-signed record. A caller that
// retries a failed CoSign uses CoSignID instead.
func (o *Org) CoSign(ctx context.Context, kind, contractID string, fields map[string]string) (ledger.Signed, error) {
	return o.CoSignID(ctx, kind, contractID, "", fields)
}

// CoSignID is CoSign under record id recordID ("" for a new one): the
// same id on each retry records the event once. A retry whose first
// attempt the partner recorded (and this org did not: the answer, or this
// org's write, was lost) gets the partner's copy back (a refusal marked
// Replayed, carrying it) and records that copy, once it verifies as
// signed by both with this org as party A; a retry whose first attempt
// this org recorded answers that.
func (o *Org) CoSignID(ctx context.Context, kind, contractID, recordID string, fields map[string]string) (ledger.Signed, error) {
	if !ledger.CoSigned(kind) || kind == ledger.KindContract {
		return ledger.Signed{}, fmt.Errorf("%w: %q is not an event of a contract", ledger.ErrBadRecord, kind)
	}
	doc, err := o.Contract(contractID)
	if err != nil {
		return ledger.Signed{}, err
	}
	if doc.Status != StatusActive {
		return ledger.Signed{}, fmt.Errorf("%w: contract %s is %s", ErrContractState, contractID, doc.Status)
	}
	partner := doc.Terms.Partner
	if partner == o.name {
		partner = doc.Terms.Proposer
	}
	if err := checkEvent(doc.Terms, kind, o.name, partner, o.now()); err != nil {
		return ledger.Signed{}, err
	}
	if recordID == "" {
		if recordID, err = NewRecordID(kind); err != nil {
			return ledger.Signed{}, err
		}
	}
	r := ledger.Record{Kind: kind, ID: recordID, Contract: contractID, A: o.name, B: partner, Time: o.now().UTC(), Fields: fields}
	have, done, err := o.recorded(r)
	if err != nil {
		return ledger.Signed{}, err
	}
	if done {
		// A retry whose first attempt recorded it here: what is left is
		// the contract's status (a termination).
		return o.coSigned(ctx, doc, have)
	}
	signed := ledger.Signed{Record: r, Signatures: []ledger.Signature{ledger.Sign(r, o.name, o.signingKey())}}
	ans, err := o.net.Call(ctx, partner, Message{Kind: MsgCoSign, From: o.name, Signed: &signed})
	if err != nil {
		return ledger.Signed{}, fmt.Errorf("asking %s to countersign %s: %w", partner, kind, err)
	}
	keys, err := o.Keys()
	if err != nil {
		return ledger.Signed{}, err
	}
	switch {
	case ans.Kind == MsgOK && ans.Signed != nil:
		// Only the partner's signature is taken from the answer; the
		// record is ours.
		if len(ans.Signed.Signatures) != 2 {
			return ledger.Signed{}, fmt.Errorf("%w: %s answered with %d signatures", ledger.ErrSignature, partner, len(ans.Signed.Signatures))
		}
		signed.Signatures = append(signed.Signatures, ans.Signed.Signatures[1])
	case ans.Replayed && ans.Signed != nil:
		// The partner holds a record of this id: an earlier attempt's,
		// which this org signed. Taken only if it is that.
		p := ans.Signed.Record
		if p.Kind != r.Kind || p.ID != r.ID || p.Contract != r.Contract || p.A != r.A || p.B != r.B {
			return ledger.Signed{}, fmt.Errorf("%w: %s holds %s %s of contract %s between %s and %s under this id", ErrDuplicateRecord, partner, p.Kind, p.ID, p.Contract, p.A, p.B)
		}
		signed = *ans.Signed
	default:
		return ledger.Signed{}, fmt.Errorf("%w: %s: %s", ErrRefused, partner, ans.Reason)
	}
	if err := signed.Verify(keys); err != nil {
		return ledger.Signed{}, err
	}
	return o.coSigned(ctx, doc, signed)
}

// coSigned records a co-signed event of doc's contract in this org's
// ledger (once: appendLocked) and, for a termination, the contract's new
// status.
func (o *Org) coSigned(ctx context.Context, doc ContractDoc, signed ledger.Signed) (ledger.Signed, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if err := o.appendLocked(ctx, signed); err != nil {
		return ledger.Signed{}, err
	}
	if signed.Record.Kind == ledger.KindTerminate {
		doc.Status = StatusTerminated
		if err := o.putContract(ctx, doc); err != nil {
			return ledger.Signed{}, err
		}
	}
	return signed, nil
}

// Receive handles a partner's request and returns the answer. Refusals
// are answers (MsgRefused with a reason), not errors; an error means this
// org could not process the request at all (e.g. its Raft is unavailable).
func (o *Org) Receive(ctx context.Context, m Message) (Message, error) {
	refuse := func(err error) (Message, error) {
		return Message{Kind: MsgRefused, From: o.name, Reason: err.Error()}, nil
	}
	if m.Kind == MsgQuote || m.Kind == MsgOffer {
		return o.receiveLoad(ctx, m, refuse)
	}
	if m.Signed == nil {
		return refuse(fmt.Errorf("%w: %s message without a record", ledger.ErrBadRecord, m.Kind))
	}
	r := m.Signed.Record
	if err := r.Validate(); err != nil {
		return refuse(err)
	}
	switch m.Kind {
	case MsgPropose:
		return o.receivePropose(ctx, m, refuse)
	case MsgAccept:
		return o.receiveAccept(ctx, m, refuse)
	case MsgReject:
		o.mu.Lock()
		defer o.mu.Unlock()
		doc, err := o.contract(r.ID)
		if err != nil {
			return refuse(err)
		}
		if doc.Status != StatusProposed || doc.Terms.Partner != m.From {
			return refuse(fmt.Errorf("%w: contract %s is %s with %s", ErrContractState, r.ID, doc.Status, doc.Terms.Partner))
		}
		doc.Status, doc.Reason = StatusRejected, m.Reason
		if err := o.putContract(ctx, doc); err != nil {
			return Message{}, err
		}
		return Message{Kind: MsgOK, From: o.name}, nil
	case MsgCoSign:
		return o.receiveCoSign(ctx, m, refuse)
	}
	return refuse(fmt.Errorf("unknown message kind %q", m.Kind))
}

// replayed refuses a message that was already received and acted on: the
// answer says so (Message.Replayed), so a sender that sent it again on
// purpose (a retried Propose or Accept) knows it arrived.
func (o *Org) replayed(err error) (Message, error) {
	return Message{Kind: MsgRefused, From: o.name, Reason: err.Error(), Replayed: true}, nil
}

// sameSigned reports whether a and b are the same record with the same
// signatures.
func sameSigned(a, b ledger.Signed) bool {
	if !bytes.Equal(a.Record.Canonical(), b.Record.Canonical()) || len(a.Signatures) != len(b.Signatures) {
		return false
	}
	for i := range a.Signatures {
		if a.Signatures[i].Org != b.Signatures[i].Org || !bytes.Equal(a.Signatures[i].Sig, b.Signatures[i].Sig) {
			return false
		}
	}
	return true
}

// recorded returns the ledger's record of r's kind and id, if any.
func (o *Org) recorded(r ledger.Record) (ledger.Signed, bool, error) {
	es, err := o.entries()
	if err != nil {
		return ledger.Signed{}, false, err
	}
	return recordedIn(es, r)
}

func recordedIn(es []ledger.Entry, r ledger.Record) (ledger.Signed, bool, error) {
	for _, e := range es {
		if e.Record.Kind == r.Kind && e.Record.ID == r.ID {
			return e.Signed, true, nil
		}
	}
	return ledger.Signed{}, false, nil
}

// receiveLoad hands a quote or an offer to the load manager once the
// contract it names is active and between this org and the sender: load
// is only ever discussed with a contract partner.
func (o *Org) receiveLoad(ctx context.Context, m Message, refuse func(error) (Message, error)) (Message, error) {
	if m.Load == nil {
		return refuse(fmt.Errorf("%w: %s message without a body", ledger.ErrBadRecord, m.Kind))
	}
	doc, err := o.Contract(m.Load.Contract)
	if err != nil {
		return refuse(err)
	}
	if doc.Status != StatusActive {
		return refuse(fmt.Errorf("%w: contract %s is %s", ErrContractState, doc.Terms.ID, doc.Status))
	}
	if p := doc.Terms; !(p.Proposer == m.From && p.Partner == o.name) && !(p.Partner == m.From && p.Proposer == o.name) {
		return refuse(fmt.Errorf("%w: contract %s is not between %s and %s", ErrContractState, doc.Terms.ID, m.From, o.name))
	}
	h := o.load.Load()
	if h == nil {
		return refuse(fmt.Errorf("%w: %s runs no load manager", ErrRefused, o.name))
	}
	return (*h).ReceiveLoad(ctx, doc, m)
}

func (o *Org) receivePropose(ctx context.Context, m Message, refuse func(error) (Message, error)) (Message, error) {
	r := m.Signed.Record
	if r.Kind != ledger.KindContract || r.A != m.From || r.B != o.name {
		return refuse(fmt.Errorf("%w: a proposal must be a contract from %s to %s", ledger.ErrBadRecord, m.From, o.name))
	}
	key, err := ledger.DecodePublicKey(m.Key)
	if err != nil {
		return refuse(err)
	}
	keys, err := o.Keys()
	if err != nil {
		return Message{}, err
	}
	if pinned, ok := keys[m.From]; ok && !pinned.Equal(key) {
		return refuse(fmt.Errorf("%w: %s presents %s, pinned %s", ErrKeyMismatch, m.From, m.Key, ledger.EncodePublicKey(pinned)))
	}
	if len(m.Signed.Signatures) != 1 || m.Signed.Signatures[0].Org != m.From || !ed25519.Verify(key, r.Canonical(), m.Signed.Signatures[0].Sig) {
		return refuse(fmt.Errorf("%w: the proposal is not signed by %s's key", ledger.ErrSignature, m.From))
	}
	t, err := termsFromRecord(r)
	if err != nil {
		return refuse(err)
	}
	if err := t.MPA().Validate(); err != nil {
		return refuse(err)
	}
	if !o.now().Before(t.NotAfter) {
		return refuse(fmt.Errorf("%w: contract %s expired at %s", mpa.ErrBadTerms, t.ID, t.NotAfter.Format(time.RFC3339)))
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if have, err := o.contract(t.ID); err == nil {
		if have.Status == StatusPending && sameSigned(have.Signed, *m.Signed) {
			return o.replayed(fmt.Errorf("%w: the proposal of contract %s from %s is pending here already", ErrReplayed, t.ID, m.From))
		}
		return refuse(fmt.Errorf("%w: contract %s already exists here (%s)", ErrContractState, t.ID, have.Status))
	}
	doc := ContractDoc{Terms: t, Status: StatusPending, Signed: *m.Signed, PartnerKey: m.Key}
	if err := o.putContract(ctx, doc); err != nil {
		return Message{}, err
	}
	return Message{Kind: MsgOK, From: o.name}, nil
}

func (o *Org) receiveAccept(ctx context.Context, m Message, refuse func(error) (Message, error)) (Message, error) {
	r := m.Signed.Record
	o.mu.Lock()
	defer o.mu.Unlock()
	doc, err := o.contract(r.ID)
	if err != nil {
		return refuse(err)
	}
	if doc.Status == StatusActive && doc.Terms.Partner == m.From && sameSigned(doc.Signed, *m.Signed) {
		return o.replayed(fmt.Errorf("%w: %s's acceptance of contract %s is recorded here already", ErrReplayed, m.From, r.ID))
	}
	if doc.Status != StatusProposed || doc.Terms.Partner != m.From {
		return refuse(fmt.Errorf("%w: contract %s is %s with %s", ErrContractState, r.ID, doc.Status, doc.Terms.Partner))
	}
	// The accepted record must be exactly the one this org signed.
	if string(r.Canonical()) != string(doc.Signed.Record.Canonical()) {
		return refuse(fmt.Errorf("%w: the accepted contract %s differs from the one proposed", ledger.ErrBadRecord, r.ID))
	}
	key, err := ledger.DecodePublicKey(m.Key)
	if err != nil {
		return refuse(err)
	}
	keys, err := o.Keys()
	if err != nil {
		return Message{}, err
	}
	pinned, ok := keys[m.From]
	if !ok {
		return refuse(fmt.Errorf("%w %q", ErrNoPinnedKey, m.From))
	}
	if !pinned.Equal(key) {
		return refuse(fmt.Errorf("%w: %s presents %s, pinned %s", ErrKeyMismatch, m.From, m.Key, ledger.EncodePublicKey(pinned)))
	}
	signed := ledger.Signed{Record: doc.Signed.Record, Signatures: m.Signed.Signatures}
	if err := signed.Verify(keys); err != nil {
		return refuse(err)
	}
	if err := o.appendLocked(ctx, signed); err != nil {
		return Message{}, err
	}
	doc.Status, doc.Signed = StatusActive, signed
	if err := o.putContract(ctx, doc); err != nil {
		return Message{}, err
	}
	return Message{Kind: MsgOK, From: o.name}, nil
}

func (o *Org) receiveCoSign(ctx context.Context, m Message, refuse func(error) (Message, error)) (Message, error) {
	r := m.Signed.Record
	if !ledger.CoSigned(r.Kind) || r.Kind == ledger.KindContract || r.A != m.From || r.B != o.name {
		return refuse(fmt.Errorf("%w: %s %s from %s to %s cannot be countersigned here", ledger.ErrBadRecord, r.Kind, r.ID, r.A, r.B))
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	doc, err := o.contract(r.Contract)
	if err != nil {
		return refuse(err)
	}
	if p := doc.Terms.Partner; p != m.From && doc.Terms.Proposer != m.From {
		return refuse(fmt.Errorf("%w: %s is not a party to contract %s", ErrContractState, m.From, r.Contract))
	}
	// Before the status: a retried termination finds the contract
	// terminated by its first attempt.
	if have, ok, err := o.recorded(r); err != nil {
		return Message{}, err
	} else if ok {
		// Answered with the record held, which the requester signed: a
		// retry whose first attempt's answer was lost takes it (CoSignID).
		why := fmt.Errorf("%w: %s %s", ErrDuplicateRecord, r.Kind, r.ID)
		if len(have.Signatures) > 0 && len(m.Signed.Signatures) == 1 && sameSigned(ledger.Signed{Record: have.Record, Signatures: have.Signatures[:1]}, *m.Signed) {
			why = fmt.Errorf("%w: %s %s of contract %s is in the ledger already", ErrReplayed, r.Kind, r.ID, r.Contract)
		}
		ans, _ := o.replayed(why)
		ans.Signed = &have
		return ans, nil
	}
	if doc.Status != StatusActive {
		return refuse(fmt.Errorf("%w: contract %s is %s", ErrContractState, r.Contract, doc.Status))
	}
	if err := checkEvent(doc.Terms, r.Kind, r.A, r.B, o.now()); err != nil {
		return refuse(err)
	}
	keys, err := o.Keys()
	if err != nil {
		return Message{}, err
	}
	if len(m.Signed.Signatures) != 1 {
		return refuse(fmt.Errorf("%w: want the requester's signature only, got %d", ledger.ErrSignature, len(m.Signed.Signatures)))
	}
	signed := ledger.Signed{Record: r, Signatures: []ledger.Signature{m.Signed.Signatures[0], ledger.Sign(r, o.name, o.key)}}
	if err := signed.Verify(keys); err != nil {
		return refuse(err)
	}
	if err := o.appendLocked(ctx, signed); err != nil {
		return Message{}, err
	}
	if r.Kind == ledger.KindTerminate {
		doc.Status = StatusTerminated
		if err := o.putContract(ctx, doc); err != nil {
			return Message{}, err
		}
	}
	return Message{Kind: MsgOK, From: o.name, Signed: &signed}, nil
}

// checkEvent checks that a contract allows an event between a and b:
// tasks of a may move to (and come back from, and be paid for at) b only
// in a direction the contract allows, and a move only while it is in
// force. A termination is always allowed between the parties.
func checkEvent(t Terms, kind, a, b string, now time.Time) error {
	switch kind {
	case ledger.KindMove, ledger.KindReturn, ledger.KindSettlement:
		m := t.MPA()
		if !m.Allows(a, b) {
			return fmt.Errorf("%w: contract %s (%s, proposed by %s) does not let %s's tasks run at %s", mpa.ErrOutsideTerms, t.ID, t.Direction, t.Proposer, a, b)
		}
		if kind == ledger.KindMove && !m.InForce(now) {
			return fmt.Errorf("%w: contract %s is not in force at %s (valid until %s)", mpa.ErrOutsideTerms, t.ID, now.UTC().Format(time.RFC3339), t.NotAfter.UTC().Format(time.RFC3339))
		}
	}
	return nil
}

func termsFromRecord(r ledger.Record) (Terms, error) {
	f := r.Fields
	num := func(k string) (float64, error) {
		v, err := strconv.ParseFloat(f[k], 64)
		if err != nil {
			return 0, fmt.Errorf("%w: contract field %s=%q: %v", mpa.ErrBadTerms, k, f[k], err)
		}
		return v, nil
	}
	t := Terms{ID: r.ID, Proposer: r.A, Partner: r.B, Direction: mpa.Direction(f["direction"])}
	var err error
	if t.PriceMin, err = num("price_min"); err != nil {
		return Terms{}, err
	}
	if t.PriceMax, err = num("price_max"); err != nil {
		return Terms{}, err
	}
	if t.MaxLoad, err = num("max_load"); err != nil {
		return Terms{}, err
	}
	if f["tasks"] != "" {
		t.Tasks = strings.Split(f["tasks"], ",")
	}
	if t.NotBefore, err = time.Parse(time.RFC3339Nano, f["not_before"]); err != nil {
		return Terms{}, fmt.Errorf("%w: not_before: %v", mpa.ErrBadTerms, err)
	}
	if t.NotAfter, err = time.Parse(time.RFC3339Nano, f["not_after"]); err != nil {
		return Terms{}, fmt.Errorf("%w: not_after: %v", mpa.ErrBadTerms, err)
	}
	if t.Notice, err = time.ParseDuration(f["notice"]); err != nil {
		return Terms{}, fmt.Errorf("%w: notice: %v", mpa.ErrBadTerms, err)
	}
	return t, nil
}

// Contract returns one contract.
func (o *Org) Contract(id string) (ContractDoc, error) { return o.contract(id) }

func (o *Org) contract(id string) (ContractDoc, error) {
	cs, err := o.store.State().Contracts(nil)
	if err != nil {
		return ContractDoc{}, err
	}
	for _, c := range cs {
		if c.ID == id {
			return decodeContract(c)
		}
	}
	return ContractDoc{}, fmt.Errorf("%w: %q", ErrNoContract, id)
}

// Contracts lists all contracts, sorted by id.
func (o *Org) Contracts() ([]ContractDoc, error) {
	cs, err := o.store.State().Contracts(nil)
	if err != nil {
		return nil, err
	}
	out := make([]ContractDoc, 0, len(cs))
	for _, c := range cs {
		d, err := decodeContract(c)
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

func decodeContract(c *fsm.Contract) (ContractDoc, error) {
	var d ContractDoc
	if err := json.Unmarshal(c.Body, &d); err != nil {
		return ContractDoc{}, fmt.Errorf("contract %s: stored body: %w", c.ID, err)
	}
	return d, nil
}

func (o *Org) putContract(ctx context.Context, d ContractDoc) error {
	_, err := o.putContractKeyed(ctx, d, "", "")
	return err
}

// proposedFor returns the id of the contract this org proposed under
// requestID ("" if none, or requestID is ""), or fsm.ErrIdempotencyMismatch
// if that proposal's request hash is not hash.
func (o *Org) proposedFor(requestID, hash string) (string, error) {
	if requestID == "" {
		return "", nil
	}
	cs, err := o.Contracts()
	if err != nil {
		return "", err
	}
	for _, d := range cs {
		if d.RequestID != requestID || d.Terms.Proposer != o.name {
			continue
		}
		if d.RequestHash != hash {
			return "", fmt.Errorf("%w: key %q was used for contract %s (request hash %s, this one %s)", fsm.ErrIdempotencyMismatch, proposeKey(requestID), d.Terms.ID, d.RequestHash, hash)
		}
		return d.Terms.ID, nil
	}
	return "", nil
}

// putContractKeyed stores d; with an idempotency key it returns the id of
// the contract the key's first request stored (d's own unless this is a
// retry).
func (o *Org) putContractKeyed(ctx context.Context, d ContractDoc, key, hash string) (string, error) {
	body, err := json.Marshal(d)
	if err != nil {
		return "", err
	}
	partner := d.Terms.Partner
	if partner == o.name {
		partner = d.Terms.Proposer
	}
	v, err := o.store.Apply(ctx, fsm.UpsertContractType, fsm.UpsertContractRequest{
		Contract:       fsm.Contract{ID: d.Terms.ID, Partner: partner, Status: d.Status, Body: body},
		IdempotencyKey: key, RequestHash: hash,
	})
	if err != nil {
		return "", err
	}
	// A Store that answers no id (a test's) wrote d.
	if id, ok := v.(string); ok && id != "" {
		return id, nil
	}
	return d.Terms.ID, nil
}

// Entries returns the org's ledger, decoded.
func (o *Org) Entries() ([]ledger.Entry, error) { return o.entries() }

func (o *Org) entries() ([]ledger.Entry, error) {
	return Entries(o.store.State())
}

// Entries decodes the ledger of a state store.
func Entries(s *fsm.StateStore) ([]ledger.Entry, error) {
	raw, err := s.LedgerEntries(nil, 1)
	if err != nil {
		return nil, err
	}
	out := make([]ledger.Entry, 0, len(raw))
	for _, r := range raw {
		var e ledger.Entry
		if err := json.Unmarshal(r.Body, &e); err != nil {
			// Kept, not dropped: verification then names this entry.
			e = ledger.Entry{Seq: r.Seq, PrevHash: r.PrevHash, Hash: r.Hash}
		}
		out = append(out, e)
	}
	return out, nil
}

// appendLocked appends s to the chain; o.mu must be held. A record of
// the same kind and id already in the chain is not appended again: the
// same signed record is a retry's append that committed before (nil),
// another is ErrDuplicateRecord. A retry that read the chain before the
// first append applied proposes the same sequence number, which the FSM
// refuses (fsm.ErrLedgerChain): either way one copy.
func (o *Org) appendLocked(ctx context.Context, s ledger.Signed) error {
	es, err := o.entries()
	if err != nil {
		return err
	}
	if have, ok, _ := recordedIn(es, s.Record); ok {
		if sameSigned(have, s) {
			return nil
		}
		return fmt.Errorf("%w: %s %s", ErrDuplicateRecord, s.Record.Kind, s.Record.ID)
	}
	var prev *ledger.Entry
	if len(es) > 0 {
		prev = &es[len(es)-1]
	}
	e := ledger.Next(prev, s, o.name, o.key)
	body, err := json.Marshal(e)
	if err != nil {
		return err
	}
	_, err = o.store.Apply(ctx, fsm.AppendLedgerEntryType, fsm.AppendLedgerEntryRequest{Entry: fsm.LedgerEntry{Seq: e.Seq, PrevHash: e.PrevHash, Hash: e.Hash, Kind: s.Record.Kind, Body: body}})
	return err
}

// Verify checks this org's ledger online: with the org's own key and the
// partner keys its ledger pinned. An auditor's offline verification uses
// only the keys it was given, which is the stronger check.
func (o *Org) Verify() (ledger.Report, error) {
	es, err := o.entries()
	if err != nil {
		return ledger.Report{}, err
	}
	keys := keysOf(es)
	keys[o.name] = o.PublicKey()
	return ledger.Verify(es, keys), nil
}

// SettlementFields are the fields of a settlement record for a period
// [from, to) in which the payee hosted loadSeconds of the payer's load
// (CPU seconds) at price per load unit per second: amount = loadSeconds x
// price. `fedstream ledger balance` sums the amounts.
func SettlementFields(loadSeconds, price float64, from, to time.Time) (map[string]string, error) {
	if !(loadSeconds >= 0) || !(price >= 0) || math.IsInf(loadSeconds, 0) || math.IsInf(price, 0) {
		return nil, fmt.Errorf("%w: settlement of %v load-seconds at %v: both must be finite and non-negative", ledger.ErrBadRecord, loadSeconds, price)
	}
	if !to.After(from) {
		return nil, fmt.Errorf("%w: settlement period ends (%s) before it starts (%s)", ledger.ErrBadRecord, to.Format(time.RFC3339), from.Format(time.RFC3339))
	}
	f := func(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }
	return map[string]string{
		"load_seconds": f(loadSeconds), "price": f(price), "amount": f(loadSeconds * price),
		"from": from.UTC().Format(time.RFC3339Nano), "to": to.UTC().Format(time.RFC3339Nano),
	}, nil
}
