package runtime

import (
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// prefaultSupported: Linux makes pages present without writing to them
// (madvise MADV_POPULATE_WRITE, Linux 5.14).
const prefaultSupported = true

var pageSize = os.Getpagesize()

// prefaultPages makes the pages under b present and writable, without
// changing a byte; false when the kernel cannot (older than 5.14), so
// that the caller stops trying.
func prefaultPages(b []byte) bool {
	// madvise wants a page-aligned start: leave out the partial first
	// page (the reader faults it, or it is already present).
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	skip := int((uintptr(pageSize) - p%uintptr(pageSize)) % uintptr(pageSize))
	if skip >= len(b) {
		return true
	}
	err := unix.Madvise(b[skip:], unix.MADV_POPULATE_WRITE)
	return err == nil || err == unix.EINTR || err == unix.EAGAIN
}
