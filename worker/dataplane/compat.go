package dataplane

import (
	"fmt"

	"github.com/fedstream/fedstream/rpc"
	"github.com/fedstream/fedstream/worker/tuple"
)

// Subscribers of an older build (rolling upgrades). A subscriber states
// its data-plane level when it subscribes (rpc.DataPlaneLevel); one below
// rpc.DataPlaneLevelUncorrectable refuses tuple type UNCORRECTABLE as
// malformed and would lose its subscription on every batch holding one.
// The server therefore sends it a REC_DONE in that record's place:
//
//   - Tuple ids are positions (a batch names only its last id), so the
//     record cannot simply be left out; its position must hold a tuple
//     the subscriber knows.
//   - REC_DONE, like UNCORRECTABLE, is outside the stable view, so the
//     batch's position offset and every stable id stay what they are.
//   - The task that could not correct puts the record right after its
//     correction's UNDO; a REC_DONE there ends nothing the UNDO did not
//     end already (a DCAA input stops counting its upstream's data as
//     tentative, as the UNDO made it; a pass-through sink may show the
//     correction's REC_DONE early). A task downstream relays the record
//     when it arrives, maybe while its own output is tentative: an older
//     consumer then stops counting that input's data as tentative until
//     the next tentative tuple (its UP_FAILURE state, sent with every
//     batch, still marks it failed). No stable tuple changes either way.
//
// What the older subscriber does not learn in band, the producing task
// still says: its status names the range that could not be corrected
// (query status), as every downstream task of a newer build does.

// downgradeForLevel returns data (a batch of encoded tuples) as a
// subscriber of data-plane level level may receive it: data itself when
// it holds nothing above that level, otherwise a copy (data aliases an
// output buffer, which is never written) in which every UNCORRECTABLE
// record is a REC_DONE at the same stream time. replaced counts them.
func downgradeForLevel(data []byte, level int32) (out []byte, replaced int, err error) {
	if rpc.EffectiveDataPlaneLevel(level) >= rpc.DataPlaneLevelUncorrectable {
		return data, 0, nil
	}
	var t tuple.Tuple
	first := -1
	for off := 0; off < len(data); {
		n, err := tuple.DecodeHeader(data[off:], &t)
		if err != nil {
			return nil, 0, fmt.Errorf("dataplane: batch for an older subscriber, byte %d: %w", off, err)
		}
		if t.Type == tuple.Uncorrectable {
			first = off
			break
		}
		off += n
	}
	if first < 0 {
		return data, 0, nil
	}
	out = make([]byte, first, len(data))
	copy(out, data[:first])
	for off := first; off < len(data); {
		n, err := tuple.DecodeHeader(data[off:], &t)
		if err != nil {
			return nil, 0, fmt.Errorf("dataplane: batch for an older subscriber, byte %d: %w", off, err)
		}
		if t.Type == tuple.Uncorrectable {
			out = tuple.AppendTuple(out, &tuple.Tuple{Type: tuple.RecDone, STime: t.STime, Version: t.Version})
			replaced++
		} else {
			out = append(out, data[off:off+n]...)
		}
		off += n
	}
	return out, replaced, nil
}

// DowngradeIndexed is downgradeForLevel for tuples held as data with an
// index (tuple i at data[offs[i]-offs[0]:], as a task snapshot keeps the
// output it retains): it returns data and offs themselves when nothing
// changes, otherwise a copy and its new index (a REC_DONE is not as long
// as the record it replaces). A snapshot fetched by a worker of an older
// build goes through it, since that worker serves these tuples again.
func DowngradeIndexed(data []byte, offs []int, level int32) (outData []byte, outOffs []int, replaced int, err error) {
	out, replaced, err := downgradeForLevel(data, level)
	if err != nil || replaced == 0 {
		return data, offs, 0, err
	}
	outOffs = make([]int, 0, len(offs))
	var t tuple.Tuple
	base := 0
	if len(offs) > 0 {
		base = offs[0]
	}
	for off := 0; off < len(out); {
		n, err := tuple.DecodeHeader(out[off:], &t)
		if err != nil {
			return nil, nil, 0, fmt.Errorf("dataplane: downgraded tuples, byte %d: %w", off, err)
		}
		outOffs = append(outOffs, base+off)
		off += n
	}
	if len(outOffs) != len(offs) {
		return nil, nil, 0, fmt.Errorf("dataplane: downgrading %d indexed tuples gave %d", len(offs), len(outOffs))
	}
	return out, outOffs, replaced, nil
}
