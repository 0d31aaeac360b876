package benchmark

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"
)

// stopGrace is how long a worker may take to exit after its stdin closes
// before its process group is killed.
const stopGrace = 3 * time.Second

// WorkerProcess is a running bench worker: In carries requests to it, Out
// its responses. Stop ends it and releases everything it holds; it is
// idempotent and safe to call concurrently. Kill ends it abruptly, as a
// crash would (SIGKILL for a child process: its connections reset at
// once, nothing is closed in order); Stop is still to be called after.
type WorkerProcess struct {
	In   io.WriteCloser
	Out  io.Reader
	Stop func() error
	Kill func() error
	// Pid is the worker's process id (0: it runs inside this process,
	// InProcessLauncher), for benches that pin a worker to a CPU.
	Pid int
}

// Launcher starts one bench worker named name (for messages).
type Launcher func(ctx context.Context, name string) (*WorkerProcess, error)

// ExecLauncher starts each worker as a child process running argv (for
// fedstream: the binary itself with "bench-worker"), speaking the protocol
// on its stdin/stdout; its stderr goes to stderr. The child runs in its own
// process group, which Stop kills if closing stdin does not end it within
// a few seconds; on Linux the child also gets SIGKILL if the parent dies.
func ExecLauncher(stderr io.Writer, argv ...string) Launcher {
	return func(ctx context.Context, name string) (*WorkerProcess, error) {
		if len(argv) == 0 {
			return nil, fmt.Errorf("%w: %s: empty worker command", ErrWorker, name)
		}
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Stderr = stderr
		cmd.SysProcAttr = childProcAttr()
		in, err := cmd.StdinPipe()
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrWorker, name, err)
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrWorker, name, err)
		}
		if err := cmd.Start(); err != nil {
			return nil, fmt.Errorf("%w: start %s: %w", ErrWorker, name, err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		var (
			once    sync.Once
			stopErr error
		)
		stop := func() error {
			once.Do(func() {
				_ = in.Close() // the worker exits on EOF
				select {
				case <-exited:
					return
				case <-time.After(stopGrace):
				}
				killGroup(cmd.Process)
				<-exited
				stopErr = fmt.Errorf("%w: %s did not exit on EOF and was killed", ErrWorker, name)
			})
			return stopErr
		}
		kill := func() error {
			killGroup(cmd.Process)
			return nil
		}
		// A cancelled run must not leave the child behind even if the
		// caller forgets Stop.
		context.AfterFunc(ctx, func() { _ = stop() })
		return &WorkerProcess{In: in, Out: out, Stop: stop, Kill: kill, Pid: cmd.Process.Pid}, nil
	}
}

// InProcessLauncher runs each worker as ServeWorker on goroutines of this
// process, connected by pipes: the same protocol and the same runtime, no
// process boundary. Used by tests and profiles.
func InProcessLauncher(logger *slog.Logger) Launcher {
	return func(ctx context.Context, name string) (*WorkerProcess, error) {
		reqR, reqW := io.Pipe()
		respR, respW := io.Pipe()
		done := make(chan error, 1)
		go func() {
			err := ServeWorker(context.WithoutCancel(ctx), reqR, respW, logger.With("worker", name))
			_ = respW.CloseWithError(errors.Join(err, io.EOF))
			_ = reqR.Close()
			done <- err
		}()
		var (
			once    sync.Once
			stopErr error
		)
		stop := func() error {
			once.Do(func() {
				_ = reqW.Close()
				_ = respR.Close()
				stopErr = <-done
			})
			return stopErr
		}
		// In-process there is no process to kill: Kill stops the worker,
		// which closes its server and connections (less abrupt than a
		// crash, the same for its consumers: their subscriptions fail).
		return &WorkerProcess{In: reqW, Out: respR, Stop: stop, Kill: stop}, nil
	}
}

// DefaultLauncher runs workers as "<this executable> bench-worker".
func DefaultLauncher() (Launcher, error) {
	return ProfilingLauncher("")
}

// ProfilingLauncher is DefaultLauncher whose workers, when dir is not
// empty, write a CPU profile of their whole life to dir/<worker name>.cpu.
func ProfilingLauncher(dir string) (Launcher, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("%w: find own executable: %w", ErrWorker, err)
	}
	if dir == "" {
		return ExecLauncher(os.Stderr, exe, "bench-worker"), nil
	}
	return func(ctx context.Context, name string) (*WorkerProcess, error) {
		profile := filepath.Join(dir, name+".cpu")
		return ExecLauncher(os.Stderr, exe, "bench-worker", "--cpuprofile", profile)(ctx, name)
	}, nil
}
