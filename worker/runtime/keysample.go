package runtime

import (
	"cmp"
	"slices"
	"sync"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/tuple"
)

// Key-frequency sampling for the health manager (data-skew sensing).
//
// A task that routes to keyed downstream fragments samples one data tuple
// in keySampleEvery: it computes the key's slot for each keyed route and
// counts it. The worker's heartbeat takes the counts (TakeKeySamples),
// which resets them, so each report holds the slots sampled since the
// previous one. Sampling costs one slot hash and one short lock per
// keySampleEvery tuples on the producing goroutine.

// keySampleEvery is the sampling period in tuples; a power of two (the
// producer tests seq&(keySampleEvery-1)).
const keySampleEvery = 64

// keySampleTop bounds the slots reported per downstream fragment.
const keySampleTop = 8

// KeySample is one sampled slot of the tuples a task sent to a keyed
// downstream fragment, with how many sampled tuples had a key in it.
type KeySample struct {
	Fragment string
	Slot     int
	Count    uint64
}

// keySampler holds the counts sampled since the last take.
type keySampler struct {
	mu sync.Mutex
	// counts: downstream fragment -> slot -> sampled tuples.
	counts map[string]map[int]uint64
	// total: downstream fragment -> sampled tuples.
	total map[string]uint64
}

// sampleKeys counts tp's slot for every keyed route. Producer goroutine
// only; the caller checks the sampling period.
func (t *task) sampleKeys(tp *tuple.Tuple) {
	for i := range t.routes {
		rt := &t.routes[i]
		if rt.keyIdx == nil {
			continue
		}
		key := make([]tuple.Value, 0, len(rt.keyIdx))
		for _, k := range rt.keyIdx {
			if k < len(tp.Values) {
				key = append(key, tp.Values[k])
			}
		}
		t.keys.add(rt.down, queryspec.Slot(key))
	}
}

func (k *keySampler) add(frag string, slot int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.counts == nil {
		k.counts, k.total = map[string]map[int]uint64{}, map[string]uint64{}
	}
	m := k.counts[frag]
	if m == nil {
		m = map[int]uint64{}
		k.counts[frag] = m
	}
	m[slot]++
	k.total[frag]++
}

// take returns the keySampleTop most sampled slots of each downstream
// fragment (by count, then slot), the sampled total per fragment, and
// resets the counts.
func (k *keySampler) take() ([]KeySample, map[string]uint64) {
	k.mu.Lock()
	counts, total := k.counts, k.total
	k.counts, k.total = nil, nil
	k.mu.Unlock()
	var out []KeySample
	for frag, m := range counts {
		var list []KeySample
		for slot, n := range m {
			list = append(list, KeySample{Fragment: frag, Slot: slot, Count: n})
		}
		slices.SortFunc(list, func(a, b KeySample) int {
			if c := cmp.Compare(b.Count, a.Count); c != 0 {
				return c
			}
			return cmp.Compare(a.Slot, b.Slot)
		})
		out = append(out, list[:min(len(list), keySampleTop)]...)
	}
	slices.SortFunc(out, func(a, b KeySample) int {
		if c := cmp.Compare(a.Fragment, b.Fragment); c != 0 {
			return c
		}
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		return cmp.Compare(a.Slot, b.Slot)
	})
	return out, total
}

// KeySamples are a task's sampled key slots since the previous take.
type KeySamples struct {
	TaskID string
	Top    []KeySample
	// Sampled is the number of sampled tuples per downstream fragment.
	Sampled map[string]uint64
}

// TakeKeySamples returns, for every task here that sampled keys since the
// previous call, its most frequent slots per keyed downstream, and resets
// the samples. One caller (the worker's heartbeat) should use it.
func (r *Runtime) TakeKeySamples() []KeySamples {
	var out []KeySamples
	for _, t := range r.tasksByID() {
		top, total := t.keys.take()
		if len(top) > 0 {
			out = append(out, KeySamples{TaskID: t.spec.TaskID, Top: top, Sampled: total})
		}
	}
	return out
}
