package coordinator

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/hashicorp/serf/serf"

	"github.com/fedstream/fedstream/fsm"
)

// ErrCommandNotSupported is returned when the leader would propose a
// command type that a coordinator of the org cannot apply yet: its build
// advertises an older replication protocol (or none can be seen for it).
// The write is refused instead of committed, because that coordinator
// would halt on the entry; it succeeds once every coordinator runs a build
// that knows the command.
var ErrCommandNotSupported = errors.New("a coordinator of the org runs a build that cannot apply this command")

// unseenProtocol is the version assumed for a Raft voter that serf does
// not show at all: nothing is known about its build.
const unseenProtocol = 0

// coordinatorProtocols maps every coordinator of the org to the replication
// protocol its build advertises (this node included, as serf shows it): each server of the Raft configuration
// (unseenProtocol if serf does not show it) and each coordinator of the
// org serf shows (it will be added as a voter and replay the log). A
// member without the tag runs a build older than the tag: BaseProtocol.
func (s *Server) coordinatorProtocols() (map[string]int, error) {
	out := map[string]int{s.cfg.NodeID: fsm.ProtocolVersion}
	cf := s.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return nil, fmt.Errorf("read raft configuration: %w", err)
	}
	for _, srv := range cf.Configuration().Servers {
		if _, ok := out[string(srv.ID)]; !ok {
			out[string(srv.ID)] = unseenProtocol
		}
	}
	for _, m := range s.serf.Members() {
		mm, ok := parseMember(m)
		if !ok || mm.Org != s.cfg.Org {
			continue
		}
		_, voter := out[mm.ID]
		if !voter && m.Status != serf.StatusAlive {
			continue // gone and not a voter: it will not apply the log
		}
		out[mm.ID] = memberProtocol(m.Tags[tagProto])
	}
	return out, nil
}

// memberProtocol parses a member's protocol tag: absent is BaseProtocol
// (a build from before the tag), malformed is unseenProtocol.
func memberProtocol(tag string) int {
	if tag == "" {
		return fsm.BaseProtocol
	}
	v, err := strconv.Atoi(tag)
	if err != nil || v < 0 {
		return unseenProtocol
	}
	return v
}

// canPropose reports whether the leader may propose a command of type t:
// every coordinator must advertise a build that knows it. Types of the
// base protocol are always allowed (every build applies them).
func (s *Server) canPropose(t fsm.MessageType) error {
	need, ok := fsm.ProtocolOf(t)
	if !ok {
		return fmt.Errorf("%w: %s is not a command this build knows", ErrCommandNotSupported, t)
	}
	return s.checkProtocol(need, t.String())
}

// checkProtocol refuses unless every coordinator speaks at least need.
func (s *Server) checkProtocol(need int, what string) error {
	if need <= fsm.BaseProtocol {
		return nil
	}
	versions, err := s.coordinatorProtocols()
	if err != nil {
		return err
	}
	var behind []string
	for id, v := range versions {
		if v < need {
			if v == unseenProtocol {
				behind = append(behind, id+" (build unknown: not visible in serf)")
			} else {
				behind = append(behind, fmt.Sprintf("%s (protocol %d)", id, v))
			}
		}
	}
	if len(behind) == 0 {
		return nil
	}
	sort.Strings(behind)
	return fmt.Errorf("%w: %s needs replication protocol %d, but coordinator %s: upgrade every coordinator first",
		ErrCommandNotSupported, what, need, strings.Join(behind, ", "))
}
