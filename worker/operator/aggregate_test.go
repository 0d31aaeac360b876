package operator

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/tuple"
)

func aggDef(size, slide string, groupBy []string, aggs ...string) *queryspec.Operator {
	def := &queryspec.Operator{Name: "agg", Type: "aggregate", Window: &queryspec.Window{Size: size, Slide: slide}, GroupBy: groupBy}
	for _, a := range aggs {
		name, expr, _ := strings.Cut(a, "=")
		def.Aggregates = append(def.Aggregates, queryspec.NamedExpr{Name: name, Expr: expr})
	}
	return def
}

func TestAggregate(t *testing.T) {
	cases := []struct {
		name   string
		def    *queryspec.Operator
		events []event
		schema string
		want   []string
		late   uint64
	}{
		{
			name: "tumbling count per group, boundary tuple goes to next window",
			def:  aggDef("10ns", "", []string{"src"}, "n=count()"),
			events: []event{
				in(0, conn(0, "b", 1, 0, true)),
				in(0, conn(3, "a", 1, 0, true)),
				in(0, conn(3, "b", 1, 0, true)), // equal timestamps
				in(0, conn(9, "a", 1, 0, true)),
				in(0, conn(10, "a", 1, 0, true)), // exactly at the end of [0,10)
				adv(10),
				in(0, conn(19, "a", 1, 0, true)),
				adv(19), // window [10,20) not closed yet
				adv(20),
			},
			schema: "{src:string,n:int,window_end:timestamp}",
			want: []string{
				`STABLE@10["a" 2 t10]`, `STABLE@10["b" 2 t10]`,
				`STABLE@20["a" 2 t20]`,
			},
		},
		{
			name: "late tuple is dropped and counted",
			def:  aggDef("10ns", "", nil, "n=count()"),
			events: []event{
				in(0, conn(1, "a", 1, 0, true)),
				adv(12),
				in(0, conn(11, "a", 1, 0, true)), // late: 11 < 12
				in(0, conn(12, "a", 1, 0, true)),
				adv(5), // watermarks never go back
				adv(30),
			},
			schema: "{n:int,window_end:timestamp}",
			want:   []string{`STABLE@10[1 t10]`, `STABLE@20[1 t20]`},
			late:   1,
		},
		{
			name: "empty windows emit nothing",
			def:  aggDef("10ns", "", []string{"src"}, "n=count()"),
			events: []event{
				in(0, conn(5, "a", 1, 0, true)),
				in(0, conn(45, "a", 1, 0, true)),
				adv(100),
			},
			schema: "{src:string,n:int,window_end:timestamp}",
			want:   []string{`STABLE@10["a" 1 t10]`, `STABLE@50["a" 1 t50]`},
		},
		{
			name: "sliding windows overlap",
			def:  aggDef("10ns", "5ns", nil, "n=count()", "s=sum(port)"),
			events: []event{
				in(0, conn(1, "a", 1, 0, true)),  // [-5,5) [0,10)
				in(0, conn(5, "a", 10, 0, true)), // [0,10) [5,15)
				in(0, conn(12, "a", 100, 0, true)),
				adv(10),
				adv(25),
			},
			schema: "{n:int,s:int,window_end:timestamp}",
			want: []string{
				`STABLE@5[1 1 t5]`, `STABLE@10[2 11 t10]`,
				`STABLE@15[2 110 t15]`, `STABLE@20[1 100 t20]`,
			},
		},
		{
			name: "count_distinct, avg of ints, sum of floats",
			def:  aggDef("1s", "", []string{"src"}, "ports=count_distinct(port)", "avg=avg(port)", "load=sum(load)"),
			events: []event{
				in(0, conn(1, "x", 22, 0.5, true)),
				in(0, conn(2, "x", 80, 0.25, true)),
				in(0, conn(3, "x", 22, 1, true)),
				in(0, conn(4, "y", 1, 2, true)),
				adv(1e9),
			},
			schema: "{src:string,ports:int,avg:float,load:float,window_end:timestamp}",
			want: []string{
				`STABLE@1000000000["x" 2 41.333333333333336 1.75 t1000000000]`,
				`STABLE@1000000000["y" 1 1 2 t1000000000]`,
			},
		},
		{
			name: "min and max of strings, ints, floats, timestamps",
			def:  aggDef("10ns", "", nil, "lo=min(src)", "hi=max(src)", "pmin=min(port)", "lmax=max(load)", "first=min(time)"),
			events: []event{
				in(0, conn(1, "m", 5, -1, true)),
				in(0, conn(2, "b", -3, 2.5, true)),
				in(0, conn(3, "zz", 9, 0, true)),
				adv(10),
			},
			schema: "{lo:string,hi:string,pmin:int,lmax:float,first:timestamp,window_end:timestamp}",
			want:   []string{`STABLE@10["b" "zz" -3 2.5 t1 t10]`},
		},
		{
			name: "tentative input makes its group tentative",
			def:  aggDef("10ns", "", []string{"src"}, "n=count()"),
			events: []event{
				in(0, conn(1, "a", 1, 0, true)),
				in(0, tentative(conn(2, "b", 1, 0, true))),
				in(0, conn(3, "b", 1, 0, true)),
				in(0, conn(11, "b", 1, 0, true)),
				adv(20),
			},
			schema: "{src:string,n:int,window_end:timestamp}",
			want:   []string{`STABLE@10["a" 1 t10]`, `TENTATIVE@10["b" 2 t10]`, `STABLE@20["b" 1 t20]`},
		},
		{
			name: "groups sorted by key, multi-field key, negative stime",
			def:  aggDef("10ns", "", []string{"port", "src"}, "n=count()"),
			events: []event{
				in(0, conn(-5, "b", 10, 0, true)),
				in(0, conn(-4, "a", 10, 0, true)),
				in(0, conn(-3, "a", -2, 0, true)),
				in(0, conn(-3, "a", 10, 0, true)),
				adv(0),
			},
			schema: "{port:int,src:string,n:int,window_end:timestamp}",
			want:   []string{`STABLE@0[-2 "a" 1 t0]`, `STABLE@0[10 "a" 2 t0]`, `STABLE@0[10 "b" 1 t0]`},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			op := mustNew(t, tc.def, connSchema)
			if got := schemaString(op.OutputSchema()); got != tc.schema {
				t.Errorf("schema = %s, want %s", got, tc.schema)
			}
			equalRows(t, run(t, op, tc.events), tc.want)
			if got := op.(LateCounter).LateTuples(); got != tc.late {
				t.Errorf("late = %d, want %d", got, tc.late)
			}
		})
	}
}

// TestAggregateCopiesStrings checks that group keys and min/max survive the
// caller overwriting the bytes its strings pointed to.
func TestAggregateCopiesStrings(t *testing.T) {
	op := mustNew(t, aggDef("10ns", "", []string{"src"}, "m=max(src)", "d=count_distinct(src)"), connSchema)
	buf := []byte("abc")
	tup := conn(1, "", 1, 0, true)
	tup.Values[1] = tuple.Str(unsafeString(buf))
	c := Collect()
	if err := op.Process(0, tup, c); err != nil {
		t.Fatal(err)
	}
	copy(buf, "xyz")
	if err := op.Advance(10, c); err != nil {
		t.Fatal(err)
	}
	equalRows(t, c.Tuples, []string{`STABLE@10["abc" "abc" 1 t10]`})
}

func TestAggregateNewErrors(t *testing.T) {
	cases := []struct {
		name     string
		def      *queryspec.Operator
		sentinel error
		mention  string
	}{
		{"no window", &queryspec.Operator{Name: "agg", Type: "aggregate", Aggregates: queryspec.Exprs{{Name: "n", Expr: "count()"}}}, ErrBadDefinition, "window.size"},
		{"bad size", aggDef("soon", "", nil, "n=count()"), ErrBadDefinition, "window.size"},
		{"zero size", aggDef("0s", "", nil, "n=count()"), ErrBadDefinition, "positive"},
		{"slide does not divide", aggDef("10s", "3s", nil, "n=count()"), ErrBadDefinition, "divide"},
		{"slide larger than size", aggDef("10s", "20s", nil, "n=count()"), ErrBadDefinition, "divide"},
		{"no aggregates", aggDef("10s", "", nil), ErrBadDefinition, "aggregates is required"},
		{"unknown function", aggDef("10s", "", nil, "n=median(port)"), ErrBadDefinition, "unknown function"},
		{"not a call", aggDef("10s", "", nil, "n=port"), ErrBadDefinition, "fn(field)"},
		{"missing argument", aggDef("10s", "", nil, "n=sum()"), ErrBadDefinition, "needs a field"},
		{"unknown aggregate field", aggDef("10s", "", nil, "n=sum(bytes)"), ErrUnknownField, `"bytes"`},
		{"sum of string", aggDef("10s", "", nil, "n=sum(src)"), ErrTypeMismatch, "sum needs"},
		{"avg of timestamp", aggDef("10s", "", nil, "n=avg(time)"), ErrTypeMismatch, "avg needs"},
		{"unknown group field", aggDef("10s", "", []string{"host"}, "n=count()"), ErrUnknownField, `"host"`},
		{"name collision", aggDef("10s", "", []string{"src"}, "src=count()"), ErrBadDefinition, "collides"},
		{"window_end collision", aggDef("10s", "", nil, "window_end=count()"), ErrBadDefinition, "collides"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.def, []*tuple.Schema{connSchema})
			if !errors.Is(err, tc.sentinel) {
				t.Fatalf("err = %v, want %v", err, tc.sentinel)
			}
			if !strings.Contains(err.Error(), tc.mention) {
				t.Errorf("error %q should mention %q", err, tc.mention)
			}
		})
	}
}

// The windows of a tuple, kept from the previous tuple while its stime
// stays in the same range, are always the ones the two floors give: for
// tumbling and sliding windows, sizes that are not multiples of the slide,
// stimes on and around window edges, going back in time, negative, and
// near the int64 limits.
func TestAggregateWindowRangeCache(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for _, w := range []struct{ size, slide int64 }{{10, 10}, {10, 3}, {7, 5}, {60e9, 60e9}, {60e9, 1e9}, {3, 7}} {
		a := &aggregate{size: w.size, slide: w.slide}
		s := int64(-50)
		var stimes []int64
		for range 5000 {
			switch rng.IntN(10) {
			case 0:
				s -= rng.Int64N(3 * w.slide) // back in time
			case 1:
				s = (s/w.slide + 1) * w.slide // on an edge
			case 2:
				s = (s/w.slide+1)*w.slide - 1 // just before one
			default:
				s += rng.Int64N(w.slide/2 + 2)
			}
			stimes = append(stimes, s)
		}
		stimes = append(stimes, math.MaxInt64-1, math.MaxInt64/4+1, 5, math.MinInt64+w.size+1, -5, 1_700_000_000_000_000_000, 1_700_000_000_000_000_001)
		for _, s := range stimes {
			if s < a.rangeFrom || s >= a.rangeTo {
				a.windowsOf(s)
			}
			wantFrom, wantTo := floorDiv(s-w.size, w.slide)+1, floorDiv(s, w.slide)
			if a.kFrom != wantFrom || a.kTo != wantTo {
				t.Fatalf("size %d slide %d stime %d: windows %d..%d, want %d..%d (range [%d, %d))",
					w.size, w.slide, s, a.kFrom, a.kTo, wantFrom, wantTo, a.rangeFrom, a.rangeTo)
			}
		}
	}
}

// TestCountDistinctMemberSharedByWindows: a tuple of a sliding window
// goes to every window that holds it; its count_distinct member is
// encoded and allocated once, not once per window (a 2 s window sliding
// every 5 ms holds each tuple 400 times: 400 allocations of the member
// per tuple made a moved copy's catch-up, and the state in memory, 400
// times larger than needed).
func TestCountDistinctMemberSharedByWindows(t *testing.T) {
	const windows = 200
	op := mustNew(t, aggDef("200ns", "1ns", []string{"port"}, "d=count_distinct(src)"), connSchema)
	c := Collect()
	payload := strings.Repeat("m", 1000)
	members := make([]*tuple.Tuple, 4*windows)
	for i := range members {
		members[i] = conn(int64(1000+i), fmt.Sprintf("%06d", i)+payload, 1, 0, true)
	}
	next := 0
	process := func() {
		// A new member in every tuple: every window holding the tuple
		// adds it.
		if err := op.Process(0, members[next], c); err != nil {
			t.Fatal(err)
		}
		next++
	}
	for range 2 * windows {
		process() // every window open
	}
	if allocs := testing.AllocsPerRun(windows, process); allocs > windows/4 {
		t.Fatalf("%.0f allocations per tuple in %d windows: the member is copied per window", allocs, windows)
	}
	// Each window counts the tuples it holds, all distinct.
	a := op.(*aggregate)
	for start, w := range a.windows {
		for _, g := range w.groups {
			want := 0
			for _, m := range members[:next] {
				if m.STime >= start && m.STime < start+200 {
					want++
				}
			}
			if n := len(g.accs[0].distinct); n != want {
				t.Fatalf("window %d counts %d distinct members, want %d", start, n, want)
			}
		}
	}
}
