package coordinator

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/federation"
	"github.com/fedstream/fedstream/federation/ledger"
	"github.com/fedstream/fedstream/federation/mpa"
	"github.com/fedstream/fedstream/fsm"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

const federationMethod = "/fedstream.v1.FederationService/"

// setupFederation loads the org's signing key from the data directory,
// creating it (mode 0600) at the first start, and builds the org's
// federation agent. The public key enters the org's Raft state when a
// leader first runs ensureOrgIdentity.
func (s *Server) setupFederation() error {
	key, created, err := ledger.LoadOrCreateSigningKey(s.cfg.DataDir)
	if err != nil {
		return fmt.Errorf("org signing key: %w", err)
	}
	if created {
		s.logger.Info("created the org signing key; every coordinator of the org needs this same file in its data directory", "file", ledger.SigningKeyFile, "public_key", ledger.EncodePublicKey(key.Public().(ed25519.PublicKey)))
	}
	s.fed = federation.NewOrg(s.cfg.Org, key, fedStore{s}, noPartners{}, nil)
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

// errNoCrossOrgTransport: the federation gossip pool and cross-org gRPC
// connections are not built yet, so no partner org can be reached.
var errNoCrossOrgTransport = errors.New("cross-org connections are not available in this build")

// noPartners is the Transport until cross-org connections exist: it knows
// no org, so proposals fail with federation.ErrUnknownOrg.
type noPartners struct{}

func (noPartners) Known(string) bool { return false }
func (noPartners) Call(context.Context, string, federation.Message) (federation.Message, error) {
	return federation.Message{}, errNoCrossOrgTransport
}

// ensureOrgIdentity records the org's public key as the ledger's first
// entry on a new leader, retrying while the write fails for a passing
// reason. A key that differs from the recorded identity is permanent:
// logged, and this coordinator signs nothing.
func (s *Server) ensureOrgIdentity(ctx context.Context) {
	delay := 100 * time.Millisecond
	for {
		err := s.fed.EnsureIdentity(ctx)
		if err == nil {
			return
		}
		if errors.Is(err, federation.ErrKeyMismatch) {
			s.logger.Error("this coordinator's org signing key is not the org's; copy "+ledger.SigningKeyFile+" from the coordinator that created it", "err", err)
			return
		}
		s.logger.Warn("recording the org identity failed; retrying", "err", err, "retry_in", delay)
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
	case errors.Is(err, mpa.ErrBadTerms), errors.Is(err, ledger.ErrBadRecord):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, federation.ErrNoContract):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, federation.ErrUnknownOrg), errors.Is(err, federation.ErrNoPinnedKey),
		errors.Is(err, federation.ErrContractState), errors.Is(err, federation.ErrKeyMismatch), errors.Is(err, federation.ErrRefused):
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
		Notice: time.Duration(req.NoticeMs) * time.Millisecond,
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
	return resp, fedStatus(fs.s.fed.Pin(ctx, req.Org, key))
}
