package coordinator

import (
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/serf/serf"
)

// TestFastGossipToleratesAStarvedMember: the shortened gossip of tests
// and dev (fastGossip) suspects a member no more eagerly than the LAN
// defaults do, in probe intervals: a member that misses probes is
// declared failed only after SuspicionMult probe intervals without a
// refutation (memberlist's minimum suspicion of a small pool), and its
// direct probe has 3 gossip intervals to answer. With 2 and 2, members
// of a loaded 2-core machine were declared failed and came back tens of
// times a minute (fastGossip's comment has the figures).
func TestFastGossipToleratesAStarvedMember(t *testing.T) {
	lan := memberlist.DefaultLANConfig()
	for _, iv := range []time.Duration{100 * time.Millisecond, 200 * time.Millisecond} {
		conf := serf.DefaultConfig()
		ml := fastGossip(conf, iv)
		if ml.SuspicionMult < lan.SuspicionMult {
			t.Errorf("gossip %v: suspicion multiplier %d, below the LAN defaults' %d", iv, ml.SuspicionMult, lan.SuspicionMult)
		}
		if ml.ProbeTimeout < 3*iv || ml.ProbeTimeout >= ml.ProbeInterval {
			t.Errorf("gossip %v: probe timeout %v, want at least 3 gossip intervals and less than the probe interval %v", iv, ml.ProbeTimeout, ml.ProbeInterval)
		}
		// The silence after which a member is declared failed, at the
		// least: a missed probe, then the suspicion.
		if d := ml.ProbeInterval + time.Duration(ml.SuspicionMult)*ml.ProbeInterval; d < 20*iv {
			t.Errorf("gossip %v: a member silent for %v is declared failed, want at least %v", iv, d, 20*iv)
		}
	}
}
