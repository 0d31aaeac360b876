package coordinator

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/federation"
	"github.com/fedstream/fedstream/federation/ledger"
	"github.com/fedstream/fedstream/federation/mpa"
	"github.com/fedstream/fedstream/fsm"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

const federationMethod = "/fedstream.v1.FederationService/"

// setupFederation loads the signing key from the data directory, creating
// one (mode 0600) at the first start, and builds the org's federation
// agent. The first leader records its public key as the org's identity
// (ensureOrgIdentity); the other coordinators then fetch that key
// (syncOrgKey).
func (s *Server) setupFederation() error {
	key, created, err := ledger.LoadOrCreateSigningKey(s.cfg.DataDir)
	if err != nil {
		return fmt.Errorf("org signing key: %w", err)
	}
	if created {
		s.logger.Info("created a signing key; it becomes the org's if this coordinator is the first leader, otherwise the org's key replaces it", "file", ledger.SigningKeyFile, "public_key", ledger.EncodePublicKey(key.Public().(ed25519.PublicKey)))
	}
	var partners federation.Transport = noPartners{}
	if s.cfg.Federation.Enabled() {
		// Started by setupFedPool; it reads s.fed only once serving.
		s.pool = &fedPool{s: s, conns: map[string]*grpc.ClientConn{}}
		partners = s.pool
	}
	s.fed = federation.NewOrg(s.cfg.Org, key, fedStore{s}, partners, nil)
	return nil
}

// fedStore is the org's Raft state as the federation agent writes it.
type fedStore struct{ s *Server }

func (f fedStore) State() *fsm.StateStore { return f.s.State() }

func (f fedStore) Apply(ctx context.Context, t fsm.MessageType, body any) (any, error) {
	res, err := f.s.apply(ctx, t, body)
	if err != nil {
		return nil, err
	}
	return res.Value, res.Err
}

// errNoCrossOrgTransport: this coordinator is in no federation pool, so no
// partner org can be reached.
var errNoCrossOrgTransport = errors.New("this coordinator is in no federation (federation.bind is not set)")

// noPartners is the Transport of a coordinator outside any federation: it
// knows no org, so proposals fail with federation.ErrUnknownOrg.
type noPartners struct{}

func (noPartners) Known(string) bool { return false }
func (noPartners) Call(context.Context, string, federation.Message) (federation.Message, error) {
	return federation.Message{}, errNoCrossOrgTransport
}

// ensureOrgIdentity records the org's public key as the ledger's first
// entry on a new leader, retrying while the write fails. A key that
// differs from the recorded identity is this coordinator's own, made at
// its first start before it learnt the org's: syncOrgKey replaces it, and
// until then this leader signs nothing.
func (s *Server) ensureOrgIdentity(ctx context.Context) {
	delay := 100 * time.Millisecond
	warned := false
	for {
		err := s.fed.EnsureIdentity(ctx)
		if err == nil {
			return
		}
		if !warned || !errors.Is(err, federation.ErrKeyMismatch) {
			s.logger.Warn("recording the org identity failed; retrying", "err", err, "retry_in", delay)
			warned = true
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		delay = min(2*delay, 5*time.Second)
	}
}

type federationService struct {
	pb.UnimplementedFederationServiceServer
	s *Server
}

// fedStatus maps the federation's errors to gRPC codes.
func fedStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	switch {
	case errors.Is(err, mpa.ErrBadTerms), errors.Is(err, ledger.ErrBadRecord), errors.Is(err, federation.ErrBadCA), errors.Is(err, fsm.ErrIdempotencyMismatch):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, federation.ErrNoContract):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, federation.ErrUnknownOrg), errors.Is(err, federation.ErrNoPinnedKey),
		errors.Is(err, federation.ErrContractState), errors.Is(err, federation.ErrKeyMismatch), errors.Is(err, federation.ErrRefused),
		errors.Is(err, mpa.ErrOutsideTerms), errors.Is(err, federation.ErrNoPinnedCA),
		errors.Is(err, federation.ErrReplayed), errors.Is(err, federation.ErrDuplicateRecord):
		return status.Error(codes.FailedPrecondition, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

func (fs *federationService) ListLedger(ctx context.Context, _ *pb.ListLedgerRequest) (*pb.ListLedgerResponse, error) {
	es, err := fs.s.fed.Entries()
	if err != nil {
		return nil, fedStatus(err)
	}
	data, err := ledger.MarshalEntries(es)
	if err != nil {
		return nil, fedStatus(err)
	}
	return &pb.ListLedgerResponse{Org: fs.s.cfg.Org, EntriesJson: data}, nil
}

func (fs *federationService) VerifyLedger(ctx context.Context, _ *pb.VerifyLedgerRequest) (*pb.VerifyLedgerResponse, error) {
	rep, err := fs.s.fed.Verify()
	if err != nil {
		return nil, fedStatus(err)
	}
	data, err := json.Marshal(rep)
	if err != nil {
		return nil, fedStatus(err)
	}
	return &pb.VerifyLedgerResponse{ReportJson: data}, nil
}

func (fs *federationService) ListContracts(ctx context.Context, _ *pb.ListContractsRequest) (*pb.ListContractsResponse, error) {
	cs, err := fs.s.fed.Contracts()
	if err != nil {
		return nil, fedStatus(err)
	}
	resp := &pb.ListContractsResponse{}
	for _, c := range cs {
		b, err := json.Marshal(c)
		if err != nil {
			return nil, fedStatus(err)
		}
		resp.ContractsJson = append(resp.ContractsJson, b)
	}
	return resp, nil
}

func contractResponse(d federation.ContractDoc, err error) (*pb.ContractResponse, error) {
	if err != nil {
		return nil, fedStatus(err)
	}
	b, err := json.Marshal(d)
	if err != nil {
		return nil, fedStatus(err)
	}
	return &pb.ContractResponse{ContractJson: b}, nil
}

func (fs *federationService) ProposeContract(ctx context.Context, req *pb.ProposeContractRequest) (*pb.ContractResponse, error) {
	resp := &pb.ContractResponse{}
	if handled, err := fs.s.leaderOrForward(ctx, federationMethod+"ProposeContract", req, resp); handled {
		return resp, err
	}
	return contractResponse(fs.s.fed.Propose(ctx, federation.ProposeRequest{
		To: req.To, PriceMin: req.PriceMin, PriceMax: req.PriceMax, MaxLoad: req.MaxLoad,
		ValidFor: time.Duration(req.ValidForMs) * time.Millisecond, Direction: req.Direction, Tasks: req.Tasks,
		Notice: time.Duration(req.NoticeMs) * time.Millisecond, RequestID: req.RequestId,
	}))
}

func (fs *federationService) AnswerContract(ctx context.Context, req *pb.AnswerContractRequest) (*pb.ContractResponse, error) {
	resp := &pb.ContractResponse{}
	if handled, err := fs.s.leaderOrForward(ctx, federationMethod+"AnswerContract", req, resp); handled {
		return resp, err
	}
	if req.Accept {
		return contractResponse(fs.s.fed.Accept(ctx, req.Id))
	}
	return contractResponse(fs.s.fed.Reject(ctx, req.Id, req.Reason))
}

func (fs *federationService) TerminateContract(ctx context.Context, req *pb.TerminateContractRequest) (*pb.ContractResponse, error) {
	resp := &pb.ContractResponse{}
	if handled, err := fs.s.leaderOrForward(ctx, federationMethod+"TerminateContract", req, resp); handled {
		return resp, err
	}
	return contractResponse(fs.s.fed.Terminate(ctx, req.Id, req.Reason))
}

func (fs *federationService) PinKey(ctx context.Context, req *pb.PinKeyRequest) (*pb.PinKeyResponse, error) {
	key, err := ledger.DecodePublicKey(req.Key)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if req.Org == "" {
		return nil, status.Error(codes.InvalidArgument, "pin: name the org whose key this is")
	}
	resp := &pb.PinKeyResponse{}
	if handled, err := fs.s.leaderOrForward(ctx, federationMethod+"PinKey", req, resp); handled {
		return resp, err
	}
	return resp, fedStatus(fs.s.fed.PinWithCA(ctx, req.Org, key, req.CaPem))
}

// syncOrgKey runs on every coordinator: once the org's identity is in the
// ledger and this coordinator's key is not it, it fetches the org's key
// from another coordinator of the org (under mutual TLS, from a peer that
// proves it is a coordinator of the org), checks it against the recorded
// public key, stores it in the data directory (0600) and signs with it
// from then on. Without mutual TLS the key is never sent: an operator
// copies the file.
func (s *Server) syncOrgKey(ctx context.Context) {
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	told := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		want, ok, err := s.fed.IdentityKey()
		if err != nil || !ok {
			continue
		}
		if want.Equal(s.fed.PublicKey()) {
			return
		}
		if s.cfg.TLS == nil {
			if !told {
				s.logger.Error("this coordinator's org signing key is not the org's, and without mutual TLS it cannot fetch it: copy "+ledger.SigningKeyFile+" from another coordinator of the org into the data directory and restart",
					"org_key", ledger.EncodePublicKey(want), "own_key", ledger.EncodePublicKey(s.fed.PublicKey()))
				told = true
			}
			continue
		}
		key, from, err := s.fetchOrgKey(ctx, want)
		if err != nil {
			if !told {
				s.logger.Warn("fetching the org signing key from another coordinator failed; retrying", "err", err)
				told = true
			}
			continue
		}
		if err := ledger.ReplaceSigningKey(s.cfg.DataDir, key); err != nil {
			s.logger.Error("storing the org signing key", "err", err)
			continue
		}
		s.fed.SetKey(key)
		s.logger.Info("fetched the org signing key", "from", from, "public_key", ledger.EncodePublicKey(want))
		return
	}
}

// fetchOrgKey asks the other voters for the org key whose public half is
// want.
func (s *Server) fetchOrgKey(ctx context.Context, want ed25519.PublicKey) (ed25519.PrivateKey, string, error) {
	fut := s.raft.GetConfiguration()
	if err := fut.Error(); err != nil {
		return nil, "", err
	}
	var errs []error
	for _, srv := range fut.Configuration().Servers {
		id := string(srv.ID)
		if id == s.cfg.NodeID {
			continue
		}
		for _, addr := range s.grpcAddrsOf(id, string(srv.Address)) {
			conn, err := s.forwarder.conn(addr, id)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			resp, err := pb.NewOrgKeyServiceClient(conn).FetchOrgKey(cctx, &pb.FetchOrgKeyRequest{})
			cancel()
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", id, err))
				continue
			}
			key, err := ledger.ParseSigningKey(resp.Pkcs8)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", id, err))
				continue
			}
			if !key.Public().(ed25519.PublicKey).Equal(want) {
				errs = append(errs, fmt.Errorf("%s sent a key that is not the org's identity", id))
				continue
			}
			return key, id, nil
		}
	}
	return nil, "", fmt.Errorf("no coordinator gave the org key: %w", errors.Join(errs...))
}

type orgKeyService struct {
	pb.UnimplementedOrgKeyServiceServer
	s *Server
}

// FetchOrgKey hands the org's signing key to another coordinator of the
// org: the role table admits only a coordinator certificate of the org,
// and without mutual TLS (where that proves nothing) it refuses.
func (ks *orgKeyService) FetchOrgKey(ctx context.Context, _ *pb.FetchOrgKeyRequest) (*pb.FetchOrgKeyResponse, error) {
	s := ks.s
	if s.cfg.TLS == nil {
		return nil, status.Error(codes.FailedPrecondition, "the org signing key is served only over mutual TLS; copy "+ledger.SigningKeyFile+" by hand")
	}
	want, ok, err := s.fed.IdentityKey()
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if !ok || !want.Equal(s.fed.PublicKey()) {
		return nil, status.Error(codes.FailedPrecondition, "this coordinator does not hold the org's signing key")
	}
	der, err := ledger.MarshalSigningKey(s.fed.SigningKey())
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &pb.FetchOrgKeyResponse{Pkcs8: der}, nil
}
