package operator

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/fedstream/fedstream/worker/tuple"
)

// TestFastPathMatchesVM is a differential test: for every expression in the
// fast subset, the typed closures and the expression VM give the same value
// on random tuples, including overflow, negative numbers, NaN and empty or
// zero-byte strings.
func TestFastPathMatchesVM(t *testing.T) {
	supported := []string{
		"port > 100 && ok",
		"port > 2.5",
		"port == 3.0",
		"port + load",
		"port / 4",
		"load / 0",
		"-port * 3",
		"+port - 1",
		"ok ? port : -port",
		"ok ? load : 1.5",
		`ok ? "y" : src`,
		`src + "x" == "ax"`,
		`src + src`,
		`!(ok || port < 0) && load >= 0.5`,
		"not ok or port <= 1",
		"time - 5 > 3",
		"2 * 3 + port",
		`"ab" < src`,
		`src >= "b" && src != ""`,
		"ok == false",
		"ok != (port > 1)",
		"load * 2 - 1.5",
		"port - 9223372036854775807 < 0",
		"port * 9223372036854775807",
		"load < port",
		"1 / 3",
		"true",
	}
	r := rand.New(rand.NewPCG(1, 2))
	srcs := []string{"", "a", "ab", "b", "\x00", "zz"}
	ints := []int64{0, 1, -1, 3, 101, math.MaxInt64, math.MinInt64, 1 << 40}
	floats := []float64{0, -0.5, 0.5, 2.5, math.Inf(1), math.NaN(), 1e300}
	for _, src := range supported {
		t.Run(src, func(t *testing.T) {
			env := newExprEnv(connSchema)
			c, err := env.compile(src, false)
			if err != nil {
				t.Fatal(err)
			}
			if c.fast == nil {
				t.Fatalf("expression should be on the fast path")
			}
			env.needVars = true // make bind fill the VM's environment too
			vm := *c
			vm.fast = nil
			for range 200 {
				s := ints[r.IntN(len(ints))]
				tup := conn(s, srcs[r.IntN(len(srcs))], ints[r.IntN(len(ints))], floats[r.IntN(len(floats))], r.IntN(2) == 0)
				if err := env.bind(tup); err != nil {
					t.Fatal(err)
				}
				want, err := env.evalValue(&vm, tup)
				if err != nil {
					t.Fatal(err)
				}
				got, _ := env.evalValue(c, tup)
				if !sameValue(got, want) {
					t.Fatalf("tuple %s: fast path %v, VM %v", row(*tup), got, want)
				}
			}
		})
	}
}

func sameValue(a, b tuple.Value) bool {
	if a.Kind == tuple.KindFloat && b.Kind == tuple.KindFloat && math.IsNaN(a.F) && math.IsNaN(b.F) {
		return true
	}
	return a == b
}

// TestFastPathDeclines: expressions outside the subset run on the VM.
func TestFastPathDeclines(t *testing.T) {
	for _, src := range []string{
		"port % 3", "port ** 2", "port in [1, 2]", "len(src)", "$env.port",
		"let x = 1; x + port", "src matches 'a.*'", "ok ? 1 : 2.5", "float(port)", "port == nil",
	} {
		env := newExprEnv(connSchema)
		c, err := env.compile(src, false)
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		if c.fast != nil || !env.needVars {
			t.Errorf("%s: should run on the VM", src)
		}
	}
}
