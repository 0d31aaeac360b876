package queryspec

import (
	"testing"
	"time"
)

func FuzzParse(f *testing.F) {
	for _, file := range exampleFiles(f) {
		f.Add(readExampleFile(f, file))
	}
	f.Add([]byte(base))
	f.Add([]byte("name: [\n"))
	f.Add([]byte("a: &a [*a]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		done := make(chan string, 1)
		go func() { done <- fuzzOne(data) }()
		select {
		case msg := <-done:
			if msg != "" {
				t.Fatal(msg)
			}
		case <-time.After(3 * time.Second):
			t.Fatalf("HANG on %q", data)
		}
	})
}

func fuzzOne(data []byte) string {
	q, err := Parse("fuzz.yaml", data)
	if err != nil {
		if err.Error() == "" {
			return "empty error message"
		}
		return ""
	}
	j, err := q.CanonicalJSON()
	if err != nil {
		return "CanonicalJSON of a valid query: " + err.Error()
	}
	q2, err := FromJSON(j)
	if err != nil {
		return "FromJSON(CanonicalJSON): " + err.Error() + "\n" + string(j)
	}
	j2, err := q2.CanonicalJSON()
	if err != nil || string(j2) != string(j) {
		return "canonical form not stable:\n" + string(j) + "\n" + string(j2)
	}
	if _, err := q.Plan(); err != nil {
		return "Plan of a valid query: " + err.Error()
	}
	return ""
}
