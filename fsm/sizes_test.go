package fsm

import "testing"

func TestTableRows(t *testing.T) {
	h := newHarness(t)
	h.registerWorker("a", "x:1")
	h.registerWorker("b", "x:2")
	h.mustApply(SubmitQueryType, SubmitQueryRequest{Query: Query{Name: "q"}, Tasks: []Task{task("q", "f", 0, 0, "a"), task("q", "f", 0, 1, "b")}})
	rows, err := h.state().TableRows()
	if err != nil {
		t.Fatal(err)
	}
	for table, want := range map[string]int{TableWorkers: 2, TableQueries: 1, TableTasks: 2, TableTokens: 0, TableLedger: 0} {
		if rows[table] != want {
			t.Errorf("%s: %d rows, want %d", table, rows[table], want)
		}
	}
	if len(rows) != len(stateSchema().Tables) {
		t.Errorf("%d tables counted, the schema has %d", len(rows), len(stateSchema().Tables))
	}
}
