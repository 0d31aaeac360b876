package coordinator

import (
	"context"
	"net/http"

	"google.golang.org/grpc/metadata"

	"github.com/fedstream/fedstream/coordinator/webui"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// WebHandler is the coordinator's live web view and its JSON API (package
// webui), to mount at the root of the coordinator's HTTP server. Its API
// answers what the admin gRPC API answers, under the same authorization.
func (s *Server) WebHandler() http.Handler {
	return webui.Handler(s.WebSource(), s.logger.With("component", "web"))
}

// WebSource is what WebHandler reads: the admin service's answers, under
// its authorization. Tests wrap it.
func (s *Server) WebSource() webui.Source { return webSource{as: &adminService{s: s}} }

// webSource reads for the web view through the admin service, so that each
// API call is authorized and answered exactly as the gRPC call of the same
// name: the HTTP request's bearer token is put where a gRPC call carries
// it, checked against the role table by the same authenticator, and
// forwarded with the call when the call goes to the leader.
type webSource struct {
	as *adminService
}

// authorized returns the incoming context of a gRPC call of method made
// with the HTTP request's token, or the authenticator's refusal. An HTTP
// request has no gRPC peer, so no certificate identity can be claimed.
func (w webSource) authorized(ctx context.Context, method string) (context.Context, error) {
	md := metadata.MD{}
	if tok := webui.Token(ctx); tok != "" {
		md.Set("authorization", "Bearer "+tok)
	}
	ctx = metadata.NewIncomingContext(ctx, md)
	if err := w.as.s.auth.check(ctx, method); err != nil {
		return nil, err
	}
	return ctx, nil
}

func (w webSource) Status(ctx context.Context) (*pb.StatusResponse, error) {
	ctx, err := w.authorized(ctx, pb.AdminService_Status_FullMethodName)
	if err != nil {
		return nil, err
	}
	return w.as.Status(ctx, &pb.StatusRequest{})
}

func (w webSource) Workers(ctx context.Context) (*pb.ListWorkersResponse, error) {
	ctx, err := w.authorized(ctx, pb.AdminService_ListWorkers_FullMethodName)
	if err != nil {
		return nil, err
	}
	return w.as.ListWorkers(ctx, &pb.ListWorkersRequest{})
}

func (w webSource) Queries(ctx context.Context) (*pb.ListQueriesResponse, error) {
	ctx, err := w.authorized(ctx, pb.AdminService_ListQueries_FullMethodName)
	if err != nil {
		return nil, err
	}
	return w.as.ListQueries(ctx, &pb.ListQueriesRequest{})
}

func (w webSource) Query(ctx context.Context, name string) (*pb.QueryInfo, error) {
	ctx, err := w.authorized(ctx, pb.AdminService_GetQuery_FullMethodName)
	if err != nil {
		return nil, err
	}
	return w.as.GetQuery(ctx, &pb.GetQueryRequest{Name: name})
}

func (w webSource) QueryStats(ctx context.Context, name string) (*pb.QueryStatsResponse, error) {
	ctx, err := w.authorized(ctx, pb.AdminService_QueryStats_FullMethodName)
	if err != nil {
		return nil, err
	}
	return w.as.QueryStats(ctx, &pb.QueryStatsRequest{Query: name})
}

func (w webSource) TasksPerCore() int { return tasksPerCore }
