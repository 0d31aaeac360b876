package fsm

import "sort"

// TableRows counts the rows of every table of the current state, by table
// name. It walks each table's id index (one read transaction, no locks
// held against the FSM); metrics call it at scrape time.
func (s *StateStore) TableRows() (map[string]int, error) {
	txn := s.readTxn(nil)
	defer txn.Abort()
	names := make([]string, 0, len(stateSchema().Tables))
	for name := range stateSchema().Tables {
		names = append(names, name)
	}
	sort.Strings(names)
	out := make(map[string]int, len(names))
	for _, name := range names {
		it, err := txn.Get(name, indexID)
		if err != nil {
			return nil, err
		}
		n := 0
		for obj := it.Next(); obj != nil; obj = it.Next() {
			n++
		}
		out[name] = n
	}
	return out, nil
}
