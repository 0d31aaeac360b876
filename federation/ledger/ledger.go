// Package ledger defines the federation ledger's records, their canonical
// encoding, the org signing keys, and verification of a whole chain.
//
// A Record is what two orgs agree on (a contract, a move, a return, a
// settlement, a termination) or what one org states about itself (its
// identity, a partner key it pinned). Its canonical encoding is signed with
// ed25519 by every party it names. An Entry wraps one signed record at one
// position of one org's chain: Seq, the previous entry's hash, the record
// and the signatures, and its own hash over all of those. Both orgs store
// the same signed record, each at its own position in its own chain, so a
// record verifies against either copy and the chains stay independent.
//
// Verification needs only the entries and the orgs' public keys: it
// recomputes every hash and link and checks every signature, and names
// the first entry where anything fails.
package ledger

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"
)

// Record kinds.
const (
	// KindIdentity: an org's own public signing key (Party A, signed by it
	// alone). The first entry of every org's ledger.
	KindIdentity = "identity"
	// KindPin: an org pinned a partner's public key (Party A pins Party
	// B's key; signed by A alone).
	KindPin = "pin"
	// KindContract: a contract both orgs accepted (A proposed, B accepted).
	KindContract = "contract"
	// KindTerminate: a contract ended early (A gave notice to B).
	KindTerminate = "terminate"
	// KindMove: tasks of A moved to B at a price.
	KindMove = "move"
	// KindReturn: tasks of A came home from B.
	KindReturn = "return"
	// KindSettlement: A owes B load-seconds x price for a period.
	KindSettlement = "settlement"
)

// kinds lists every kind and whether both parties sign it.
var kinds = map[string]bool{
	KindIdentity: false, KindPin: false,
	KindContract: true, KindTerminate: true, KindMove: true, KindReturn: true, KindSettlement: true,
}

// CoSigned reports whether records of kind k carry both parties'
// signatures (false for identity and pin, which one org states alone).
func CoSigned(k string) bool { return kinds[k] }

// Errors.
var (
	// ErrBadRecord: a record is malformed (unknown kind, parties missing).
	ErrBadRecord = errors.New("malformed ledger record")
	// ErrSignature: a signature is missing, from the wrong org, or does
	// not verify.
	ErrSignature = errors.New("bad ledger signature")
	// ErrUnknownKey: no public key for an org a record names.
	ErrUnknownKey = errors.New("no public key for org")
)

// Record is the content of one ledger entry. Fields is free-form detail
// (terms of a contract, tasks of a move, amounts of a settlement), always
// strings so that the encoding is exact.
type Record struct {
	Kind string `json:"kind"`
	// ID names the record (a contract id, a move id); unique per kind
	// between the two parties.
	ID       string `json:"id"`
	Contract string `json:"contract,omitempty"`
	// A and B are the parties: proposer and partner of a contract, owner
	// and host of a move or a return, payer and payee of a settlement;
	// for identity and pin, A is the org itself.
	A      string            `json:"a"`
	B      string            `json:"b,omitempty"`
	Time   time.Time         `json:"time"`
	Fields map[string]string `json:"fields,omitempty"`
}

// Validate checks the record's shape.
func (r Record) Validate() error {
	co, ok := kinds[r.Kind]
	switch {
	case !ok:
		return fmt.Errorf("%w: unknown kind %q", ErrBadRecord, r.Kind)
	case r.ID == "" || r.A == "":
		return fmt.Errorf("%w: %s record needs an id and party a (got %q, %q)", ErrBadRecord, r.Kind, r.ID, r.A)
	case (co || r.Kind == KindPin) && (r.B == "" || r.B == r.A):
		return fmt.Errorf("%w: %s record %s needs a party b other than %q (got %q)", ErrBadRecord, r.Kind, r.ID, r.A, r.B)
	case r.Time.IsZero():
		return fmt.Errorf("%w: %s record %s has no time", ErrBadRecord, r.Kind, r.ID)
	}
	return nil
}

// Signers are the orgs that must sign r: A, and B when the kind is
// co-signed.
func (r Record) Signers() []string {
	if kinds[r.Kind] {
		return []string{r.A, r.B}
	}
	return []string{r.A}
}

// The canonical encodings start with a domain string so that a signature
// over a record can never be taken for one over anything else.
const (
	recordDomain = "fedstream-ledger-record-v1"
	entryDomain  = "fedstream-ledger-entry-v1"
)

// appendField appends one length-prefixed field: uvarint byte length, then
// the bytes. Length prefixes make the encoding unambiguous whatever the
// fields contain.
func appendField(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// Canonical is the exact byte string signed for r: the domain, then kind,
// id, contract, a, b, time (RFC 3339 in UTC with nanoseconds), the number
// of fields, and each field's key and value in key order, every item
// length-prefixed.
func (r Record) Canonical() []byte {
	b := appendField(nil, recordDomain)
	for _, s := range []string{r.Kind, r.ID, r.Contract, r.A, r.B, r.Time.UTC().Format(time.RFC3339Nano)} {
		b = appendField(b, s)
	}
	keys := make([]string, 0, len(r.Fields))
	for k := range r.Fields {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b = appendField(b, strconv.Itoa(len(keys)))
	for _, k := range keys {
		b = appendField(b, k)
		b = appendField(b, r.Fields[k])
	}
	return b
}

// Signature is one org's ed25519 signature over a record's canonical
// encoding.
type Signature struct {
	Org string `json:"org"`
	Sig []byte `json:"sig"`
}

// Sign returns org's signature over r.
func Sign(r Record, org string, key ed25519.PrivateKey) Signature {
	return Signature{Org: org, Sig: ed25519.Sign(key, r.Canonical())}
}

// Signed is a record with its signatures.
type Signed struct {
	Record     Record      `json:"record"`
	Signatures []Signature `json:"signatures"`
}

// Keyring maps org names to their public signing keys.
type Keyring map[string]ed25519.PublicKey

// Verify checks that every org r.Signers names has signed exactly once
// with its key in keys, and that no one else signed.
func (s Signed) Verify(keys Keyring) error {
	if err := s.Record.Validate(); err != nil {
		return err
	}
	want := s.Record.Signers()
	if len(s.Signatures) != len(want) {
		return fmt.Errorf("%w: %s %s carries %d signatures, want %d (%v)", ErrSignature, s.Record.Kind, s.Record.ID, len(s.Signatures), len(want), want)
	}
	msg := s.Record.Canonical()
	for i, org := range want {
		sig := s.Signatures[i]
		if sig.Org != org {
			return fmt.Errorf("%w: %s %s: signature %d is by %q, want %q", ErrSignature, s.Record.Kind, s.Record.ID, i+1, sig.Org, org)
		}
		key, ok := keys[org]
		if !ok {
			return fmt.Errorf("%w %q (%s %s)", ErrUnknownKey, org, s.Record.Kind, s.Record.ID)
		}
		if len(sig.Sig) != ed25519.SignatureSize || !ed25519.Verify(key, msg, sig.Sig) {
			return fmt.Errorf("%w: %s %s: %s's signature does not verify", ErrSignature, s.Record.Kind, s.Record.ID, org)
		}
	}
	return nil
}

// Entry is one position of an org's chain.
type Entry struct {
	Seq      uint64 `json:"seq"`
	PrevHash string `json:"prev_hash"`
	Hash     string `json:"hash"`
	Signed
	// Org owns the chain; ChainSig is its signature over Hash. Without
	// it anyone able to write the stored chain could reorder co-signed
	// records and recompute every hash; with it, only the org's key can
	// produce a chain that verifies.
	Org      string `json:"org"`
	ChainSig []byte `json:"chain_sig"`
}

// ComputeHash is the hex SHA-256 of the entry's canonical encoding: the
// entry domain, seq (decimal), prev_hash, the record's canonical encoding,
// the number of signatures, each signature's org and bytes, and the
// chain's org, every item length-prefixed. The stored Hash and ChainSig
// are not part of it.
func (e Entry) ComputeHash() string {
	b := appendField(nil, entryDomain)
	b = appendField(b, strconv.FormatUint(e.Seq, 10))
	b = appendField(b, e.PrevHash)
	b = appendField(b, string(e.Record.Canonical()))
	b = appendField(b, strconv.Itoa(len(e.Signatures)))
	for _, s := range e.Signatures {
		b = appendField(b, s.Org)
		b = appendField(b, string(s.Sig))
	}
	b = appendField(b, e.Org)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// chainMessage is what ChainSig signs: the chain domain and the hash.
func chainMessage(hash string) []byte {
	return appendField(appendField(nil, chainDomain), hash)
}

const chainDomain = "fedstream-ledger-chain-v1"

// Next builds the entry that appends s after prev (nil for the first) in
// org's chain, signed with org's key.
func Next(prev *Entry, s Signed, org string, key ed25519.PrivateKey) Entry {
	e := Entry{Seq: 1, Signed: s, Org: org}
	if prev != nil {
		e.Seq, e.PrevHash = prev.Seq+1, prev.Hash
	}
	e.Hash = e.ComputeHash()
	e.ChainSig = ed25519.Sign(key, chainMessage(e.Hash))
	return e
}

// Report is the outcome of Verify, the shape `fedstream ledger verify
// --json` prints.
type Report struct {
	Entries int  `json:"entries"`
	Valid   bool `json:"valid"`
	// FirstBad is the Seq of the first entry that fails, nil when all
	// pass.
	FirstBad *uint64 `json:"first_bad"`
	Reason   string  `json:"reason"`
}

// Verify checks a whole chain from its first entry: seq numbers 1, 2, ...
// in order, each prev_hash equal to the previous entry's hash, each hash
// recomputed, every entry of one org and signed by it (ChainSig), each
// record well formed and signed by every party with the key in keys. The chain's own identity and pin entries add no keys: an
// auditor trusts only the keys it holds. But an identity or pin entry
// whose key differs from the auditor's key for that org fails, so a chain
// cannot claim a key the auditor does not know. seq in the Report is
// where the chain breaks; entries after it are not judged.
func Verify(entries []Entry, keys Keyring) Report {
	rep := Report{Entries: len(entries), Valid: true, Reason: "ok"}
	fail := func(e Entry, i int, format string, args ...any) Report {
		seq := uint64(i + 1)
		rep.Valid, rep.FirstBad = false, &seq
		rep.Reason = fmt.Sprintf("entry %d (%s %s): ", seq, e.Record.Kind, e.Record.ID) + fmt.Sprintf(format, args...)
		return rep
	}
	prev := ""
	for i, e := range entries {
		if e.Seq != uint64(i+1) {
			return fail(e, i, "seq is %d where %d belongs: entries were removed, inserted or reordered", e.Seq, i+1)
		}
		if e.PrevHash != prev {
			return fail(e, i, "prev_hash %.12s does not match the previous entry's hash %.12s: the chain was reordered or an earlier entry replaced", e.PrevHash, prev)
		}
		if h := e.ComputeHash(); h != e.Hash {
			return fail(e, i, "stored hash %.12s, recomputed %.12s: the entry was altered", e.Hash, h)
		}
		if e.Org != entries[0].Org {
			return fail(e, i, "entry of %q's chain inside %q's", e.Org, entries[0].Org)
		}
		if key, ok := keys[e.Org]; !ok {
			return fail(e, i, "%v %q (the chain's owner)", ErrUnknownKey, e.Org)
		} else if len(e.ChainSig) != ed25519.SignatureSize || !ed25519.Verify(key, chainMessage(e.Hash), e.ChainSig) {
			return fail(e, i, "%v: %s's chain signature does not verify: the chain was rewritten without its key", ErrSignature, e.Org)
		}
		if err := e.Signed.Verify(keys); err != nil {
			return fail(e, i, "%v", err)
		}
		if err := checkClaimedKey(e.Record, keys); err != nil {
			return fail(e, i, "%v", err)
		}
		prev = e.Hash
	}
	return rep
}

// checkClaimedKey fails an identity or pin record whose key is not the
// one in keys for the org it is about.
func checkClaimedKey(r Record, keys Keyring) error {
	var org string
	switch r.Kind {
	case KindIdentity:
		org = r.A
	case KindPin:
		org = r.B
	default:
		return nil
	}
	claimed, err := DecodePublicKey(r.Fields[FieldKey])
	if err != nil {
		return fmt.Errorf("%w: %s record: %v", ErrBadRecord, r.Kind, err)
	}
	if known, ok := keys[org]; ok && !known.Equal(claimed) {
		return fmt.Errorf("%w: the %s record states a key for %s that is not the one the verifier holds", ErrSignature, r.Kind, org)
	}
	return nil
}

// FieldKey is the field of identity and pin records holding the public key
// (EncodePublicKey).
const FieldKey = "key"

// MarshalEntries is the export format: one JSON array of entries.
func MarshalEntries(entries []Entry) ([]byte, error) {
	return json.MarshalIndent(entries, "", "  ")
}

// UnmarshalEntries reads the export format.
func UnmarshalEntries(data []byte) ([]Entry, error) {
	var es []Entry
	if err := json.Unmarshal(data, &es); err != nil {
		return nil, fmt.Errorf("read ledger export: %w", err)
	}
	return es, nil
}
