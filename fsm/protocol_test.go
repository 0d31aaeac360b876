package fsm

import "testing"

// TestEveryCommandHasAProtocol: a command type without a protocol version
// could be proposed while a coordinator that cannot apply it still runs.
func TestEveryCommandHasAProtocol(t *testing.T) {
	for typ := range commandDecoders {
		v, ok := ProtocolOf(typ)
		if !ok {
			t.Errorf("%s has no entry in commandProtocol", typ)
			continue
		}
		if v < BaseProtocol || v > ProtocolVersion {
			t.Errorf("%s: protocol %d outside [%d, %d]", typ, v, BaseProtocol, ProtocolVersion)
		}
	}
	for typ := range commandProtocol {
		if _, ok := commandDecoders[typ]; !ok {
			t.Errorf("commandProtocol lists %s, which has no decoder", typ)
		}
	}
}
