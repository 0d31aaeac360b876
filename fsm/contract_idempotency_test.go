package fsm

import (
	"errors"
	"strings"
	"testing"
)

// A new contract proposal carries a client-chosen idempotency key and the
// fingerprint of the client's request: a retry (whose record is built
// anew, so its id, time and signature differ) stores nothing and answers
// the first proposal's id; the same key with another request, or with
// another command type, is refused naming the key; a snapshot keeps both.
func TestContractProposalIdempotency(t *testing.T) {
	first := UpsertContractRequest{Contract: Contract{ID: "c-1", Partner: "beta", Status: "proposed", Body: []byte(`{"sig":"a"}`)}, IdempotencyKey: "propose/r1", RequestHash: "h1"}
	retry := first
	retry.Contract = Contract{ID: "c-2", Partner: "beta", Status: "proposed", Body: []byte(`{"sig":"b"}`)}
	forged := retry
	forged.RequestHash = "h2"
	type step struct {
		typ     MessageType
		body    any
		wantErr error  // nil: applies
		wantVal string // the id answered
		dedup   bool
	}
	cases := []struct {
		name  string
		steps []step
		// contracts stored at the end, by id
		want []string
	}{
		{"first proposal stores and answers its id",
			[]step{{typ: UpsertContractType, body: first, wantVal: "c-1"}}, []string{"c-1"}},
		{"retry answers the first id and stores nothing",
			[]step{{typ: UpsertContractType, body: first, wantVal: "c-1"}, {typ: UpsertContractType, body: retry, wantVal: "c-1", dedup: true}}, []string{"c-1"}},
		{"retry of other content is refused",
			[]step{{typ: UpsertContractType, body: first, wantVal: "c-1"}, {typ: UpsertContractType, body: forged, wantErr: ErrIdempotencyMismatch}}, []string{"c-1"}},
		{"key of another command type is refused",
			[]step{{typ: RegisterWorkerType, body: RegisterWorkerRequest{Worker: Worker{ID: "w1"}, IdempotencyKey: "propose/r1"}, wantVal: "w1"},
				{typ: UpsertContractType, body: retry, wantErr: ErrIdempotencyKeyReused}}, nil},
		{"a refused retry does not record its key",
			[]step{{typ: UpsertContractType, body: UpsertContractRequest{Contract: Contract{ID: "c-1"}, IdempotencyKey: "propose/r1", RequestHash: "h1"}, wantErr: ErrInvalidRequest},
				{typ: UpsertContractType, body: first, wantVal: "c-1"}}, []string{"c-1"}},
		{"without a key every upsert applies (transitions of a stored contract)",
			[]step{{typ: UpsertContractType, body: UpsertContractRequest{Contract: first.Contract}, wantVal: "c-1"},
				{typ: UpsertContractType, body: UpsertContractRequest{Contract: retry.Contract}, wantVal: "c-2"}}, []string{"c-1", "c-2"}},
		{"a key recorded without a request hash compares by type",
			[]step{{typ: UpsertContractType, body: UpsertContractRequest{Contract: first.Contract, IdempotencyKey: "propose/r1"}, wantVal: "c-1"},
				{typ: UpsertContractType, body: forged, wantVal: "c-1", dedup: true}}, []string{"c-1"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			for i, s := range tc.steps {
				res := h.apply(s.typ, s.body)
				if s.wantErr != nil {
					if !errors.Is(res.Err, s.wantErr) || (s.wantErr != ErrInvalidRequest && !strings.Contains(res.Err.Error(), `"propose/r1"`)) {
						t.Fatalf("step %d: %v, want %v naming the key", i, res.Err, s.wantErr)
					}
					continue
				}
				if res.Err != nil || res.Value != s.wantVal || res.Deduplicated != s.dedup {
					t.Fatalf("step %d: %+v, want value %q deduplicated %v", i, res, s.wantVal, s.dedup)
				}
			}
			check := func(s *StateStore) {
				t.Helper()
				cs, err := s.Contracts(nil)
				if err != nil {
					t.Fatal(err)
				}
				var ids []string
				for _, c := range cs {
					ids = append(ids, c.ID)
					if c.ID == "c-1" && string(c.Body) != string(first.Contract.Body) {
						t.Fatalf("c-1 was rewritten: %s", c.Body)
					}
				}
				if strings.Join(ids, ",") != strings.Join(tc.want, ",") {
					t.Fatalf("contracts %v, want %v", ids, tc.want)
				}
			}
			check(h.state())
			// The keys and their request hashes survive a snapshot: the
			// same answers after a restore.
			restored := &harness{t: t, fsm: roundTrip(t, h.fsm), index: h.index}
			check(restored.state())
			if len(tc.want) == 1 {
				if res := restored.apply(UpsertContractType, retry); res.Err != nil || res.Value != "c-1" || !res.Deduplicated {
					t.Fatalf("retry after a restore: %+v", res)
				}
				if tc.name != "a key recorded without a request hash compares by type" {
					if res := restored.apply(UpsertContractType, forged); !errors.Is(res.Err, ErrIdempotencyMismatch) {
						t.Fatalf("other content after a restore: %+v", res)
					}
				}
				check(restored.state())
			}
		})
	}
}
