package coordinator

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/source"
	"github.com/fedstream/fedstream/worker/tuple"
)

// xorgReference is the result of xorgQuery over limit generated lines,
// computed from the generator in the test process, in the form
// xorgOrg.results returns: "window_end/word" -> "cnt=N total=M". The
// generator is deterministic (seed 7, its event times derived from the
// rate), so this is the result of a run left alone without running one:
// the cross-org tests used to run the query once through the cluster for
// it first, 3-10 s of the package's serial part each, with a core busy.
func xorgReference(t *testing.T, limit int) map[string]string {
	t.Helper()
	q, err := queryspec.Parse("ref.yaml", []byte(fmt.Sprintf(xorgQuery, "ref", 1, limit)))
	if err != nil {
		t.Fatal(err)
	}
	gen, err := source.NewGenerator(q.Sources[0].Gen, 0)
	if err != nil {
		t.Fatal(err)
	}
	type key struct {
		end  int64
		word string
	}
	cnt, total := map[key]int64{}, map[key]int64{}
	const size = int64(20 * time.Millisecond) // the aggregate's window
	var tp tuple.Tuple
	for gen.Next(&tp) {
		// map: word = the first word, n = the number of words; filter n > 7.
		words := strings.Split(tp.Values[0].S, " ")
		if len(words) <= 7 {
			continue
		}
		k := key{(tp.STime/size + 1) * size, words[0]}
		cnt[k]++
		total[k] += int64(len(words))
	}
	ref := map[string]string{}
	for k, n := range cnt {
		ref[fmt.Sprintf("%d/%s", k.end, k.word)] = fmt.Sprintf("cnt=%d total=%d", n, total[k])
	}
	return ref
}
