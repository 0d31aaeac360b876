//go:build !linux

package runtime

// prefaultSupported: other platforms fault pages in as the reader writes
// them.
const prefaultSupported = false

func prefaultPages([]byte) bool { return false }
