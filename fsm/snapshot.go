package fsm

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"

	"github.com/hashicorp/go-memdb"
	"github.com/hashicorp/raft"
)

// Snapshot stream format (version 1), one JSON object per line:
//
//	{"kind":"header","data":{"format":"fedstream-fsm","version":1}}
//	{"kind":"<record kind>","data":{...record...}}   (table by table, in id order)
//	{"kind":"end","data":{"records":N,"sha256":"<hex of all preceding bytes>"}}
//
// The end record makes truncation at a line boundary detectable and the
// digest catches corruption that still parses as JSON.
const (
	snapshotFormat  = "fedstream-fsm"
	snapshotVersion = 1
	kindHeader      = "header"
	kindEnd         = "end"
)

type snapshotLine struct {
	Kind string          `json:"kind"`
	Data json.RawMessage `json:"data"`
}

type snapshotHeader struct {
	Format  string `json:"format"`
	Version int    `json:"version"`
}

type snapshotTrailer struct {
	Records int    `json:"records"`
	SHA256  string `json:"sha256"`
}

// snapshotKind is one record kind: the table it lives in and how to decode it.
type snapshotKind struct {
	kind   string
	table  string
	decode func([]byte) (any, error)
}

// decodeRecord decodes one record, ignoring fields this build does not know
// (a snapshot written by a newer build restores on an older one, as its log
// entries apply). An unknown record kind, a table this build lacks, is
// still refused: dropping a whole table would diverge.
func decodeRecord[T any](data []byte) (any, error) {
	v := new(T)
	if err := decodeBody(data, v); err != nil {
		return nil, err
	}
	return v, nil
}

// snapshotKinds lists every table in persist order. A table missing here is
// caught by TestSnapshotCoversEveryTable.
var snapshotKinds = []snapshotKind{
	{"worker", TableWorkers, decodeRecord[Worker]},
	{"query", TableQueries, decodeRecord[Query]},
	{"task", TableTasks, decodeRecord[Task]},
	{"token", TableTokens, decodeRecord[Token]},
	{"operator_version", TableOperatorVersions, decodeRecord[OperatorVersion]},
	{"contract", TableContracts, decodeRecord[Contract]},
	{"ledger_entry", TableLedger, decodeRecord[LedgerEntry]},
	{"health_action", TableHealthActions, decodeRecord[HealthAction]},
	{"idempotency", TableIdempotency, decodeRecord[IdempotencyRecord]},
	{"slot_map", TableSlotMaps, decodeRecord[SlotMap]},
	{"hosted_task", TableHostedTasks, decodeRecord[HostedTask]},
	{"table_index", tableIndexes, decodeRecord[tableIndexEntry]},
}

// fsmSnapshot is a point-in-time memdb snapshot (cheap: immutable radix trees).
type fsmSnapshot struct {
	db *memdb.MemDB
}

// Snapshot captures the current state; the work happens in Persist. A
// halted FSM refuses: its state lacks an entry the log holds, and a
// snapshot would let raft compact that entry away.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	if err := f.HaltErr(); err != nil {
		return nil, err
	}
	return &fsmSnapshot{db: f.state.gen.Load().db.Snapshot()}, nil
}

// Persist writes the snapshot stream to sink.
func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	if err := writeSnapshot(sink, s.db); err != nil {
		if cerr := sink.Cancel(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("cancel snapshot sink: %w", cerr))
		}
		return fmt.Errorf("persist fsm snapshot: %w", err)
	}
	return sink.Close()
}

// Release is a no-op: the memdb snapshot is garbage collected.
func (s *fsmSnapshot) Release() {}

type lineWriter struct {
	w       *bufio.Writer
	digest  hash.Hash
	records int
}

func (lw *lineWriter) write(kind string, data any) error {
	raw, err := json.Marshal(data)
	if err != nil {
		return fmt.Errorf("encode %s record: %w", kind, err)
	}
	line, err := json.Marshal(snapshotLine{Kind: kind, Data: raw})
	if err != nil {
		return fmt.Errorf("encode %s line: %w", kind, err)
	}
	line = append(line, '\n')
	if kind != kindEnd {
		lw.digest.Write(line)
	}
	_, err = lw.w.Write(line)
	return err
}

func writeSnapshot(w io.Writer, db *memdb.MemDB) error {
	lw := &lineWriter{w: bufio.NewWriter(w), digest: sha256.New()}
	if err := lw.write(kindHeader, snapshotHeader{Format: snapshotFormat, Version: snapshotVersion}); err != nil {
		return err
	}
	txn := db.Txn(false)
	for _, k := range snapshotKinds {
		it, err := txn.Get(k.table, indexID)
		if err != nil {
			return fmt.Errorf("list %s: %w", k.table, err)
		}
		for obj := it.Next(); obj != nil; obj = it.Next() {
			if err := lw.write(k.kind, obj); err != nil {
				return err
			}
			lw.records++
		}
	}
	trailer := snapshotTrailer{Records: lw.records, SHA256: hex.EncodeToString(lw.digest.Sum(nil))}
	if err := lw.write(kindEnd, trailer); err != nil {
		return err
	}
	return lw.w.Flush()
}

// Restore replaces the state with the snapshot in rc. The snapshot is read
// into a fresh store that is swapped in only if the whole stream is valid;
// otherwise the error wraps ErrCorruptSnapshot and the old state stays.
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	g, records, err := readSnapshot(rc)
	if err != nil {
		f.logger.Error("snapshot restore failed; keeping current state", "err", err)
		return err
	}
	f.state.swap(g)
	f.logger.Info("restored state from snapshot", "records", records, "latest_index", f.state.LatestIndex())
	return nil
}

func corrupt(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrCorruptSnapshot, fmt.Sprintf(format, args...))
}

func readSnapshot(r io.Reader) (*generation, int, error) {
	g, err := newGeneration()
	if err != nil {
		return nil, 0, err
	}
	kinds := map[string]snapshotKind{}
	for _, k := range snapshotKinds {
		kinds[k.kind] = k
	}
	br := bufio.NewReader(r)
	digest := sha256.New()
	lineNo := 0
	readLine := func() (snapshotLine, []byte, error) {
		raw, err := br.ReadBytes('\n')
		lineNo++
		if errors.Is(err, io.EOF) {
			if len(raw) == 0 {
				return snapshotLine{}, nil, corrupt("truncated: stream ends before line %d (no end record)", lineNo)
			}
			return snapshotLine{}, nil, corrupt("truncated: line %d has no newline", lineNo)
		}
		if err != nil {
			return snapshotLine{}, nil, fmt.Errorf("%w: read line %d: %v", ErrCorruptSnapshot, lineNo, err)
		}
		var line snapshotLine
		if err := decodeBody(bytes.TrimSuffix(raw, []byte{'\n'}), &line); err != nil {
			return snapshotLine{}, nil, corrupt("line %d: %v", lineNo, err)
		}
		return line, raw, nil
	}

	line, raw, err := readLine()
	if err != nil {
		return nil, 0, err
	}
	if line.Kind != kindHeader {
		return nil, 0, corrupt("line 1: first record is %q, want %q", line.Kind, kindHeader)
	}
	var header snapshotHeader
	if err := decodeBody(line.Data, &header); err != nil {
		return nil, 0, corrupt("header: %v", err)
	}
	if header.Format != snapshotFormat || header.Version != snapshotVersion {
		return nil, 0, corrupt("header: format %q version %d, this node reads %q version %d", header.Format, header.Version, snapshotFormat, snapshotVersion)
	}
	digest.Write(raw)

	txn := g.db.Txn(true)
	defer txn.Abort() // no-op after Commit
	perTable := map[string]int{}
	records := 0
	for {
		line, raw, err := readLine()
		if err != nil {
			return nil, 0, err
		}
		if line.Kind == kindEnd {
			var trailer snapshotTrailer
			if err := decodeBody(line.Data, &trailer); err != nil {
				return nil, 0, corrupt("end record: %v", err)
			}
			if trailer.Records != records {
				return nil, 0, corrupt("end record counts %d records, stream has %d", trailer.Records, records)
			}
			if sum := hex.EncodeToString(digest.Sum(nil)); trailer.SHA256 != sum {
				return nil, 0, corrupt("sha256 mismatch: end record says %s, stream hashes to %s", trailer.SHA256, sum)
			}
			break
		}
		digest.Write(raw)
		k, ok := kinds[line.Kind]
		if !ok {
			return nil, 0, corrupt("line %d: unknown record kind %q", lineNo, line.Kind)
		}
		obj, err := k.decode(line.Data)
		if err != nil {
			return nil, 0, corrupt("line %d: %s record: %v", lineNo, k.kind, err)
		}
		if err := txn.Insert(k.table, obj); err != nil {
			return nil, 0, corrupt("line %d: %s record: %v", lineNo, k.kind, err)
		}
		perTable[k.table]++
		records++
	}
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		return nil, 0, corrupt("data after end record")
	}
	// memdb.Insert replaces on equal primary keys, so a duplicate shows up as
	// fewer rows than records read.
	for table, n := range perTable {
		it, err := txn.Get(table, indexID)
		if err != nil {
			return nil, 0, fmt.Errorf("count %s: %w", table, err)
		}
		rows := 0
		for obj := it.Next(); obj != nil; obj = it.Next() {
			rows++
		}
		if rows != n {
			return nil, 0, corrupt("table %s: %d records but %d distinct ids (duplicate primary key)", table, n, rows)
		}
	}
	txn.Commit()
	g.idempotencyKeys = perTable[TableIdempotency]
	return g, records, nil
}
