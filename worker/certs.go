package worker

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/rpc"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/tlsutil"
)

// installCertificate makes certPEM (signed by the org's CA for this
// worker's id) the worker's certificate. When the identity changes (first
// registration, or a new id after the org forgot the worker), the cached
// coordinator connections are closed: they were opened under the old
// identity or none, and new ones present the new certificate.
func (w *Worker) installCertificate(certPEM, keyPEM []byte, workerID string) error {
	prev, _, had := w.cfg.TLS.Identity()
	if err := w.cfg.TLS.SetCertificate(certPEM, keyPEM); err != nil {
		return fmt.Errorf("certificate from the coordinators: %w", err)
	}
	id, notAfter, _ := w.cfg.TLS.Identity()
	if want := (rpc.Identity{Org: w.cfg.TLS.Org(), Role: rpc.RoleWorker, Name: workerID}); id != want {
		return fmt.Errorf("certificate from the coordinators is for %s, want %s", id, want)
	}
	w.logger.Info("worker certificate installed", "identity", id.String(), "expires", notAfter.UTC().Format(time.RFC3339))
	if !had || prev != id {
		w.dropConns()
	}
	return nil
}

// dropConns closes the cached coordinator connections; calls in flight on
// them fail and are retried on new ones.
func (w *Worker) dropConns() {
	w.mu.Lock()
	old := w.conns
	w.conns = map[string]*grpc.ClientConn{}
	w.mu.Unlock()
	for _, c := range old {
		_ = c.Close()
	}
}

// renewAt is when a certificate valid from notBefore to notAfter is
// renewed: at two thirds of its life, leaving a third for retries.
func renewAt(notBefore, notAfter time.Time) time.Time {
	return notBefore.Add(notAfter.Sub(notBefore) * 2 / 3)
}

// renewLoop renews the worker's certificate before it expires. A worker
// whose certificate has expired (it was cut off longer than a third of
// the certificate's life) can no longer prove who it is: it registers again.
func (w *Worker) renewLoop(ctx context.Context) {
	for {
		notBefore, notAfter, ok := w.cfg.TLS.Lifetime()
		if !ok {
			return
		}
		life := notAfter.Sub(notBefore)
		if !sleepCtx(ctx, time.Until(renewAt(notBefore, notAfter))) {
			return
		}
		retry := min(max(life/20, 100*time.Millisecond), 30*time.Second)
		for {
			_, _, epoch := w.identity()
			err := w.renew(ctx)
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return
			}
			if time.Now().After(notAfter) || status.Code(err) == codes.NotFound {
				w.logger.Warn("worker certificate could not be renewed before it expired; registering again", "err", err)
				if time.Now().After(notAfter) {
					// Coordinators refuse an expired certificate at the
					// handshake: register without one, as a new worker does.
					w.cfg.TLS.ClearCertificate()
					w.dropConns()
				}
				w.reregister(ctx, epoch)
				break
			}
			w.logger.Warn("worker certificate renewal failed; retrying", "err", err, "expires", notAfter.UTC().Format(time.RFC3339))
			if !sleepCtx(ctx, retry) {
				return
			}
		}
	}
}

func (w *Worker) renew(ctx context.Context) error {
	csr, keyPEM, err := tlsutil.NewCSR()
	if err != nil {
		return err
	}
	id, _, _ := w.identity()
	var resp *pb.RenewCertificateResponse
	err = w.call(ctx, 10*time.Second, func(ctx context.Context, c pb.WorkerServiceClient) error {
		var err error
		resp, err = c.RenewCertificate(ctx, &pb.RenewCertificateRequest{WorkerId: id, Csr: csr})
		return err
	})
	if err != nil {
		return err
	}
	return w.installCertificate(resp.Certificate, keyPEM, id)
}
