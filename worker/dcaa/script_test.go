package dcaa

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fedstream/fedstream/worker/tuple"
)

// Scripted interactions with one Machine (testdata/*.script). Each line
// is a command at a clock time (milliseconds); the lines after it that
// start with "> " are the actions it must return, in order (none: no
// action). Blank lines and "#" comments are ignored.
//
//	config id=0 replicas=2 inputs=2,2 share=100 detect=30 [detectmax=MS] [healthmax=MS] [strict] [chunk=N] [background] [keep=N]
//	start T
//	deliver T in=I [att=N] [state=STABLE|UP_FAILURE|STABILIZATION] [twm=MS] TUPLES...
//	    TUPLES: s<id>@<ms> stable, t<id>@<ms> tentative, b<id>@<ms> boundary
//	    (b<id>@end: the final boundary, end of stream), u<id> UNDO back to
//	    id, r<id> REC_DONE; att: the subscription attempt that received it
//	    (Subscribe.Attempt; default the current one); bg: the input's
//	    background subscription received it (its attempt)
//	fail T in=I [att=N] [bg]
//	states T in=I [at=MS] STATE,STATE... (at: UpstreamStates.At)
//	request T from=P | reply T from=P granted|denied | done T from=P
//	tick T
//	deadline: NextDeadline, as the runtime asks it before it waits (a
//	    later Step far past it shows the caller ran late)
//	expect-state STATE
//	expect-limit MS: the detection timeout now (DetectLimit)
//	expect-health N: the local health score now
//
// Actions print as:
//
//	subscribe in=I r=R after=ID [promoted]
//	background in=I r=R after=ID | stop-background in=I
//	checkpoint at=MS
//	release stable|tentative|replay MS[I:ID,...] ...
//	restore | recdone | ask peers=P,.. | reply to=P granted|denied
//	notify peers=P,.. | state FROM->TO
func TestScripts(t *testing.T) {
	files, err := filepath.Glob("testdata/*.script")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) { runScript(t, f) })
	}
}

func runScript(t *testing.T, path string) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m *Machine
	var got []string // actions of the last command not yet matched
	lineNo := 0
	cmdLine := ""
	flush := func() {
		if len(got) > 0 {
			t.Fatalf("%s: after %q: unexpected actions:\n%s", path, cmdLine, strings.Join(got, "\n"))
		}
	}
	for _, line := range strings.Split(string(data), "\n") {
		lineNo++
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if want, ok := strings.CutPrefix(line, "> "); ok {
			if len(got) == 0 {
				t.Fatalf("%s:%d: after %q: want %q, got no more actions", path, lineNo, cmdLine, want)
			}
			if got[0] != want {
				t.Fatalf("%s:%d: after %q: want %q, got %q (then %q)", path, lineNo, cmdLine, want, got[0], got[1:])
			}
			got = got[1:]
			continue
		}
		flush()
		cmdLine = line
		f := strings.Fields(line)
		args := map[string]string{}
		var rest []string
		for _, a := range f[1:] {
			if k, v, ok := strings.Cut(a, "="); ok {
				args[k] = v
			} else {
				rest = append(rest, a)
			}
		}
		now := int64(0)
		if len(rest) > 0 {
			if v, err := strconv.ParseInt(rest[0], 10, 64); err == nil {
				now, rest = v*ms, rest[1:]
			}
		}
		num := func(k string) int {
			v, err := strconv.Atoi(args[k])
			if err != nil {
				t.Fatalf("%s:%d: %s=%q: %v", path, lineNo, k, args[k], err)
			}
			return v
		}
		var acts []Action
		switch f[0] {
		case "config":
			cfg := Config{ID: num("id"), Replicas: num("replicas"), Detect: time.Duration(num("detect")) * time.Millisecond,
				Share: time.Duration(num("share")) * time.Millisecond}
			for _, k := range strings.Split(args["inputs"], ",") {
				n, _ := strconv.Atoi(k)
				cfg.Inputs = append(cfg.Inputs, n)
			}
			if _, ok := args["chunk"]; ok {
				cfg.ReplayChunk = num("chunk")
			}
			if _, ok := args["keep"]; ok {
				cfg.KeepLimit = num("keep")
			}
			if _, ok := args["detectmax"]; ok {
				cfg.DetectMax = time.Duration(num("detectmax")) * time.Millisecond
			}
			if _, ok := args["healthmax"]; ok {
				cfg.HealthMax = time.Duration(num("healthmax")) * time.Millisecond
			}
			for _, r := range rest {
				switch r {
				case "strict":
					cfg.StrictMode = true
				case "background":
					cfg.Background = true
				}
			}
			if m, err = New(cfg); err != nil {
				t.Fatalf("%s:%d: %v", path, lineNo, err)
			}
			continue
		case "start":
			acts = m.Start(now)
		case "deliver":
			ev := Deliver{Input: num("in"), Upstream: parseState(t, args["state"])}
			if _, ok := args["twm"]; ok {
				ev.TentWatermark = int64(num("twm")) * ms
			}
			if _, ok := args["att"]; ok {
				ev.Attempt = uint64(num("att"))
			}
			rest = bgAttempt(t, m, num("in"), rest, &ev.Attempt)
			for _, tok := range rest {
				ev.Tuples = append(ev.Tuples, parseTuple(t, tok))
			}
			acts = m.Step(now, ev)
		case "fail":
			ev := SubscriptionFailed{Input: num("in")}
			if _, ok := args["att"]; ok {
				ev.Attempt = uint64(num("att"))
			}
			bgAttempt(t, m, num("in"), rest, &ev.Attempt)
			acts = m.Step(now, ev)
		case "states":
			ev := UpstreamStates{Input: num("in")}
			if _, ok := args["at"]; ok {
				ev.At = int64(num("at")) * int64(time.Millisecond)
			}
			for _, s := range strings.Split(rest[0], ",") {
				ev.States = append(ev.States, parseState(t, s))
			}
			acts = m.Step(now, ev)
		case "request":
			acts = m.Step(now, PermissionRequest{From: num("from")})
		case "reply":
			acts = m.Step(now, PermissionReply{From: num("from"), Granted: len(rest) > 0 && rest[0] == "granted"})
		case "done":
			acts = m.Step(now, PeerDone{From: num("from")})
		case "tick":
			acts = m.Step(now, Tick{})
		case "deadline":
			m.NextDeadline()
			continue
		case "expect-limit":
			if got, want := m.DetectLimit(), time.Duration(num("ms"))*time.Millisecond; got != want {
				t.Fatalf("%s:%d: detection timeout %v, want %v", path, lineNo, got, want)
			}
			continue
		case "expect-health":
			if got, want := m.Health(), num("n"); got != want {
				t.Fatalf("%s:%d: local health %d, want %d", path, lineNo, got, want)
			}
			continue
		case "expect-state":
			if s := m.State().String(); s != rest[0] {
				t.Fatalf("%s:%d: state %s, want %s", path, lineNo, s, rest[0])
			}
			continue
		default:
			t.Fatalf("%s:%d: unknown command %q", path, lineNo, f[0])
		}
		got = renderActions(acts)
	}
	flush()
}

// bgAttempt: when rest starts with "bg", the event came on input i's
// background subscription: *attempt is its attempt (the machine has one)
// and the rest follows.
func bgAttempt(t *testing.T, m *Machine, i int, rest []string, attempt *uint64) []string {
	if len(rest) == 0 || rest[0] != "bg" {
		return rest
	}
	_, a, ok := m.Background(i)
	if !ok {
		t.Fatalf("input %d has no background subscription", i)
	}
	*attempt = a
	return rest[1:]
}

func parseState(t *testing.T, s string) State {
	switch s {
	case "", "STABLE":
		return Stable
	case "UP_FAILURE":
		return UpFailure
	case "STABILIZATION":
		return Stabilization
	case "UNKNOWN":
		return Unknown
	}
	t.Fatalf("unknown state %q", s)
	return 0
}

func parseTuple(t *testing.T, tok string) tuple.Tuple {
	kind, rest := tok[0], tok[1:]
	idS, stS, _ := strings.Cut(rest, "@")
	id, err := strconv.ParseUint(idS, 10, 64)
	if err != nil {
		t.Fatalf("tuple %q: %v", tok, err)
	}
	var st int64
	if stS == "end" {
		st = math.MaxInt64
	} else if stS != "" {
		v, err := strconv.ParseInt(stS, 10, 64)
		if err != nil {
			t.Fatalf("tuple %q: %v", tok, err)
		}
		st = v * ms
	}
	types := map[byte]tuple.Type{'s': tuple.Stable, 't': tuple.Tentative, 'b': tuple.Boundary, 'u': tuple.Undo, 'r': tuple.RecDone}
	typ, ok := types[kind]
	if !ok {
		t.Fatalf("tuple %q: unknown kind %q", tok, kind)
	}
	tp := tuple.Tuple{Type: typ, ID: id, STime: st}
	if typ.IsData() {
		tp.Values = []tuple.Value{tuple.Int(int64(id))}
	}
	return tp
}

func renderActions(acts []Action) []string {
	var out []string
	ints := func(v []int) string {
		s := make([]string, len(v))
		for i, x := range v {
			s[i] = strconv.Itoa(x)
		}
		return strings.Join(s, ",")
	}
	for _, a := range acts {
		switch a := a.(type) {
		case Subscribe:
			s := fmt.Sprintf("subscribe in=%d r=%d after=%d", a.Input, a.Replica, a.AfterID)
			if a.Promoted {
				s += " promoted"
			}
			out = append(out, s)
		case SubscribeBackground:
			out = append(out, fmt.Sprintf("background in=%d r=%d after=%d", a.Input, a.Replica, a.AfterID))
		case StopBackground:
			out = append(out, fmt.Sprintf("stop-background in=%d", a.Input))
		case Checkpoint:
			out = append(out, fmt.Sprintf("checkpoint at=%s", msOf(a.Watermark)))
		case Release:
			kind := "stable"
			switch {
			case a.Replay:
				kind = "replay"
			case a.Tentative:
				kind = "tentative"
			}
			var b strings.Builder
			b.WriteString("release " + kind)
			for _, s := range a.Steps {
				var ids []string
				for _, run := range s.Runs {
					for _, t := range run.Tuples {
						ids = append(ids, fmt.Sprintf("%d:%d", run.Input, t.ID))
					}
				}
				fmt.Fprintf(&b, " %s[%s]", msOf(s.Advance), strings.Join(ids, ","))
			}
			out = append(out, b.String())
		case Restore:
			out = append(out, "restore")
		case RecDone:
			out = append(out, "recdone")
		case AskPermission:
			out = append(out, "ask peers="+ints(a.Peers))
		case ReplyPermission:
			g := "denied"
			if a.Granted {
				g = "granted"
			}
			out = append(out, fmt.Sprintf("reply to=%d %s", a.To, g))
		case NotifyDone:
			out = append(out, "notify peers="+ints(a.Peers))
		case StateChange:
			out = append(out, fmt.Sprintf("state %v->%v", a.From, a.To))
		default:
			out = append(out, fmt.Sprintf("%T", a))
		}
	}
	return out
}

func msOf(ns int64) string {
	if ns == math.MaxInt64 {
		return "end"
	}
	if ns%ms == 0 {
		return strconv.FormatInt(ns/ms, 10)
	}
	return fmt.Sprintf("%dns", ns)
}
