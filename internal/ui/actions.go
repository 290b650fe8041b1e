package ui

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/ops"
	"github.com/zyvor/kairon/internal/rules"
)

// The actions: each is ordinary API requests made as the request's user
// (userClient), so RBAC, the MachineMigration webhook and the admission
// policies decide, and their refusal comes back verbatim: the API server's
// status code and message. kairon-ui reads what it decides on (the
// evacuation plan's Machines, migrations and budgets) as the user too,
// straight from the API server, as kaironctl does: a cache that lags
// would not show the migrations just created.

// EvacuateRequest is the body of POST /api/v1/actions/evacuate.
type EvacuateRequest struct {
	Node string `json:"node"`
	// Strategy is cold (the default) or live.
	Strategy string `json:"strategy"`
	// UntilEmpty keeps going after this pass, as kaironctl evacuate
	// --wait: kairon-ui makes another pass each time Machines, migrations
	// or budgets change, until the node is empty, the user cancels, or
	// nothing can move (see evacuations.go).
	UntilEmpty bool `json:"untilEmpty"`
}

// MigrateRequest is the body of POST /api/v1/actions/migrate.
type MigrateRequest struct {
	Namespace string `json:"namespace"`
	Machine   string `json:"machine"`
	Strategy  string `json:"strategy"`
	// TargetNode is empty for the scheduler's choice.
	TargetNode string `json:"targetNode"`
}

// ScaleRequest is the body of POST /api/v1/actions/scale.
type ScaleRequest struct {
	Namespace string `json:"namespace"`
	Pool      string `json:"pool"`
	Replicas  *int32 `json:"replicas"`
}

// Evacuation is what one evacuation pass did: the answer of
// /api/v1/actions/evacuate.
type Evacuation struct {
	Node string `json:"node"`
	// Machines is how many Machines were on the node.
	Machines int `json:"machines"`
	// Created got a MachineMigration now (migration names it).
	Created []EvacuatedMachine `json:"created"`
	// InFlight already had one (migration names it), and got no other.
	InFlight []EvacuatedMachine `json:"inFlight"`
	// Skipped were held back: reason is the budgets' (with their numbers)
	// or the API server's refusal, verbatim; budgets names the blocking
	// budgets.
	Skipped []EvacuatedMachine `json:"skipped"`
	// Deleting are being deleted and leave without a migration.
	Deleting []EvacuatedMachine `json:"deleting"`
	Summary  string             `json:"summary"`
	// Job is, with untilEmpty, the evacuation that goes on after this
	// pass (GET /api/v1/evacuations); null without it, or when this pass
	// left nothing to wait for.
	Job *EvacuationJob `json:"job"`
}

// EvacuatedMachine is one Machine of an evacuation.
type EvacuatedMachine struct {
	Namespace string   `json:"namespace"`
	Name      string   `json:"name"`
	Migration string   `json:"migration"`
	Reason    string   `json:"reason"`
	Budgets   []string `json:"budgets"`
}

// Migrated is the answer of /api/v1/actions/migrate.
type Migrated struct {
	Namespace  string `json:"namespace"`
	Machine    string `json:"machine"`
	Migration  string `json:"migration"`
	SourceNode string `json:"sourceNode"`
	TargetNode string `json:"targetNode"`
	Strategy   string `json:"strategy"`
}

// Scaled is the answer of /api/v1/actions/scale.
type Scaled struct {
	Namespace string `json:"namespace"`
	Pool      string `json:"pool"`
	Replicas  int32  `json:"replicas"`
}

func (s *Server) actionRoutes() {
	if !s.opts.AllowWrite {
		s.authed.HandleFunc("POST /api/v1/actions/", func(w http.ResponseWriter, r *http.Request) {
			writeError(w, http.StatusForbidden, "actions are off: kairon-ui runs without --allow-write")
		})
		return
	}
	s.authed.HandleFunc("POST /api/v1/actions/evacuate", action(s, s.evacuate))
	s.authed.HandleFunc("POST /api/v1/actions/evacuate-cancel", action(s, s.cancelEvacuation))
	s.authed.HandleFunc("POST /api/v1/actions/migrate", action(s, s.migrate))
	s.authed.HandleFunc("POST /api/v1/actions/scale", action(s, s.scale))
}

// actionError is an action's refusal with its HTTP status.
type actionError struct {
	code int
	msg  string
}

func (e *actionError) Error() string { return e.msg }

func refuse(code int, format string, args ...any) error {
	return &actionError{code: code, msg: fmt.Sprintf(format, args...)}
}

// action decodes the request body into Req, runs do as the request's user
// and answers its result or error: the API server's status and message as
// they came, an actionError's, or 500.
func action[Req, Resp any](s *Server, do func(ctx context.Context, c client.Client, req *Req) (Resp, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := checkSameOrigin(r, true); err != nil {
			writeError(w, http.StatusForbidden, err.Error())
			return
		}
		u := userOf(r.Context())
		if u == nil {
			writeError(w, http.StatusUnauthorized, errNotAuthenticate.Error())
			return
		}
		var req Req
		dec := json.NewDecoder(io.LimitReader(r.Body, 64<<10))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			writeError(w, http.StatusBadRequest, "reading the request: "+err.Error())
			return
		}
		c, err := s.userClient(u)
		if err != nil {
			writeError(w, http.StatusInternalServerError, err.Error())
			return
		}
		resp, err := do(r.Context(), c, &req)
		if err != nil {
			var ae *actionError
			var status apierrors.APIStatus
			switch {
			case errors.As(err, &ae):
				writeError(w, ae.code, ae.msg)
			case errors.As(err, &status) && status.Status().Code != 0:
				writeError(w, int(status.Status().Code), status.Status().Message)
			default:
				writeError(w, http.StatusInternalServerError, err.Error())
			}
			return
		}
		writeJSON(w, http.StatusOK, resp)
	}
}

// strategyOf is the request's strategy: cold when it names none.
func strategyOf(s string) (kaironv1.MigrationStrategy, error) {
	if s == "" {
		return kaironv1.MigrationCold, nil
	}
	if st, ok := ops.ParseStrategy(s); ok {
		return st, nil
	}
	return "", refuse(http.StatusBadRequest, "invalid strategy %q: use cold or live", s)
}

// evacuate makes one pass of `kaironctl evacuate NODE` and, with
// untilEmpty, starts the job that makes the next ones.
func (s *Server) evacuate(ctx context.Context, c client.Client, req *EvacuateRequest) (*Evacuation, error) {
	if req.Node == "" {
		return nil, refuse(http.StatusBadRequest, "node must not be empty")
	}
	strategy, err := strategyOf(req.Strategy)
	if err != nil {
		return nil, err
	}
	u := userOf(ctx)
	if req.UntilEmpty {
		if j := s.evacuations.running(u, req.Node); j != nil {
			return nil, refuse(http.StatusConflict, "node %s is already being evacuated until empty (evacuation %s, started %s); cancel it first", req.Node, j.ID, j.StartedAt.Format(time.RFC3339))
		}
	}
	res, err := evacuatePass(ctx, c, req.Node, strategy)
	if err != nil {
		return nil, err
	}
	if req.UntilEmpty && res.Machines > 0 {
		res.Job = s.startEvacuation(u, c, req.Node, strategy, res)
	}
	return res, nil
}

// evacuatePass is one pass, ops.EvacuationPass, made as the user: the
// shared plan over what the user reads, and a MachineMigration for every
// Machine the budgets allow, created as the user.
func evacuatePass(ctx context.Context, c client.Client, node string, strategy kaironv1.MigrationStrategy) (*Evacuation, error) {
	pass, err := ops.EvacuationPass{Node: node, Strategy: strategy}.Run(ctx, c)
	var create *ops.CreateError
	switch {
	case errors.As(err, &create):
		return nil, create.Err
	case err != nil:
		return nil, err
	}
	if len(pass.OnNode) == 0 {
		if err := c.Get(ctx, client.ObjectKey{Name: node}, &corev1.Node{}); apierrors.IsNotFound(err) {
			return nil, refuse(http.StatusNotFound, "node %q not found, and no Machine has spec.nodeName %q", node, node)
		}
	}
	res := &Evacuation{Node: node, Machines: len(pass.OnNode), Created: []EvacuatedMachine{}, InFlight: []EvacuatedMachine{}, Skipped: []EvacuatedMachine{}, Deleting: []EvacuatedMachine{}}
	for _, o := range pass.Outcomes {
		m := EvacuatedMachine{Namespace: o.Machine.Namespace, Name: o.Machine.Name, Budgets: []string{}}
		switch o.Verdict {
		case rules.EvacuationDeleting:
			res.Deleting = append(res.Deleting, m)
		case rules.EvacuationInFlight:
			m.Migration = o.Migration.Name
			res.InFlight = append(res.InFlight, m)
		case rules.EvacuationBlocked:
			m.Reason = o.Reason
			if o.Budgets != nil {
				m.Budgets = o.Budgets
			}
			res.Skipped = append(res.Skipped, m)
		case rules.EvacuationMigrate:
			if o.Refused != nil {
				m.Reason = o.Refused.Error()
				res.Skipped = append(res.Skipped, m)
				continue
			}
			m.Migration = o.Created.Name
			res.Created = append(res.Created, m)
		}
	}
	parts := []string{fmt.Sprintf("%d Machines on node %s", res.Machines, node), fmt.Sprintf("%d migrations created", len(res.Created))}
	if n := len(res.InFlight); n > 0 {
		parts = append(parts, fmt.Sprintf("%d already migrating", n))
	}
	if n := len(res.Deleting); n > 0 {
		parts = append(parts, fmt.Sprintf("%d being deleted", n))
	}
	parts = append(parts, fmt.Sprintf("%d skipped", len(res.Skipped)))
	res.Summary = strings.Join(parts, ", ")
	return res, nil
}

// migrate is `kaironctl migrate MACHINE`: the Machine's budgets are asked
// first with the shared plan, then the MachineMigration is created as the
// user.
func (s *Server) migrate(ctx context.Context, c client.Client, req *MigrateRequest) (*Migrated, error) {
	if req.Namespace == "" || req.Machine == "" {
		return nil, refuse(http.StatusBadRequest, "namespace and machine must not be empty")
	}
	strategy, err := strategyOf(req.Strategy)
	if err != nil {
		return nil, err
	}
	started, err := ops.StartMigration(ctx, c, ops.Migration{Namespace: req.Namespace, Machine: req.Machine, Strategy: strategy, TargetNode: req.TargetNode})
	var not *ops.NotMigrated
	switch {
	case errors.As(err, &not):
		return nil, notMigrated(req, not)
	case err != nil:
		return nil, err
	}
	mig := started.Migration
	return &Migrated{Namespace: mig.Namespace, Machine: req.Machine, Migration: mig.Name, SourceNode: started.SourceNode, TargetNode: req.TargetNode, Strategy: string(strategy)}, nil
}

// notMigrated is a 409 naming why the Machine was not migrated, or the
// webhook's refusal as it came.
func notMigrated(req *MigrateRequest, not *ops.NotMigrated) error {
	switch not.Cause {
	case ops.NotOnNode:
		return refuse(http.StatusConflict, "machine %s/%s is not on a node yet: nothing to migrate", req.Namespace, req.Machine)
	case ops.AlreadyOnTarget:
		return refuse(http.StatusConflict, "machine %s/%s already runs on node %s", req.Namespace, req.Machine, req.TargetNode)
	case ops.Deleting:
		return refuse(http.StatusConflict, "machine %s/%s is being deleted", req.Namespace, req.Machine)
	case ops.InFlight:
		return refuse(http.StatusConflict, "machine %s/%s already has migration %s in flight", req.Namespace, req.Machine, not.Migration.Name)
	case ops.Blocked:
		return refuse(http.StatusConflict, "machine %s/%s not migrated: %s", req.Namespace, req.Machine, not.Reason)
	}
	return not.Err
}

// scale sets a MachinePool's spec.replicas through its scale subresource,
// as `kaironctl scale machinepool` and kubectl scale do.
func (s *Server) scale(ctx context.Context, c client.Client, req *ScaleRequest) (*Scaled, error) {
	if req.Namespace == "" || req.Pool == "" || req.Replicas == nil {
		return nil, refuse(http.StatusBadRequest, "namespace, pool and replicas are required")
	}
	if *req.Replicas < 0 {
		return nil, refuse(http.StatusBadRequest, "replicas must be 0 or more, not %d", *req.Replicas)
	}
	pool := &kaironv1.MachinePool{ObjectMeta: metav1.ObjectMeta{Namespace: req.Namespace, Name: req.Pool}}
	if err := ops.Scale(ctx, c, pool, *req.Replicas); err != nil {
		return nil, err
	}
	return &Scaled{Namespace: req.Namespace, Pool: req.Pool, Replicas: *req.Replicas}, nil
}
