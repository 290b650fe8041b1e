package ui

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/ops"
)

// Evacuation until empty: `kaironctl evacuate NODE --wait` run by the
// server. After the first pass (made in the request, so a refusal is its
// answer), a job makes another pass each time Machines, migrations or
// budgets change in the cache (at most one a second, and every
// Options.EvacuatePoll besides), each one as the user with the user's
// credentials and the shared plan, until:
//
//   - the node is empty (Empty);
//   - the user cancels it (Cancelled);
//   - nothing can move (Stuck): a pass created no migration while none was
//     in flight and no Machine was being deleted, and it stayed so for
//     Options.EvacuateStuckAfter; the reason is the skipped Machines' (the
//     budgets with their numbers);
//   - the API server refuses a pass for the user's sake (403, an expired
//     token: Failed, with its message), or Options.EvacuateTimeout passes.
//
// Progress is published as the "evacuations" kind on the event stream, so
// the Nodes page redraws it live. A job lives in this kairon-ui process
// only: it ends when kairon-ui stops, and with several replicas each shows
// its own.

// Evacuation job states.
const (
	EvacuationRunning   = "Running"
	EvacuationEmpty     = "Empty"
	EvacuationCancelled = "Cancelled"
	EvacuationStuck     = "Stuck"
	EvacuationFailed    = "Failed"
)

// EvacuationJob is an evacuation until empty, as GET /api/v1/evacuations
// and the Nodes page show it.
type EvacuationJob struct {
	ID       string `json:"id"`
	Node     string `json:"node"`
	Strategy string `json:"strategy"`
	// State is Running, Empty, Cancelled, Stuck or Failed; Reason says why
	// it stopped ("" while Running).
	State  string `json:"state"`
	Reason string `json:"reason"`
	// StartedBy is the user who started it ("" if not known).
	StartedBy  string     `json:"startedBy"`
	StartedAt  time.Time  `json:"startedAt"`
	UpdatedAt  time.Time  `json:"updatedAt"`
	FinishedAt *time.Time `json:"finishedAt"`
	// Passes is how many passes it made; Remaining, how many Machines
	// were on the node at the last one.
	Passes    int `json:"passes"`
	Remaining int `json:"remaining"`
	// Migrated are the Machines it created a migration for, all passes.
	Migrated []EvacuatedMachine `json:"migrated"`
	// Last is the last pass.
	Last *Evacuation `json:"last"`
	// LastError is the last pass's error when it was one to retry.
	LastError string `json:"lastError"`
}

// CancelEvacuationRequest is the body of POST
// /api/v1/actions/evacuate-cancel.
type CancelEvacuationRequest struct {
	ID string `json:"id"`
}

// evacuations are the jobs of this process.
type evacuations struct {
	mu   sync.Mutex
	seq  int
	jobs []*evacJob
}

type evacJob struct {
	// owner is the user key of who started it: only they see and cancel
	// it.
	owner  string
	cancel context.CancelFunc
	mu     sync.Mutex
	view   EvacuationJob
}

func (j *evacJob) snapshot() EvacuationJob {
	j.mu.Lock()
	defer j.mu.Unlock()
	v := j.view
	v.Migrated = slices.Clone(v.Migrated)
	return v
}

// finishedJobsKept is how long a finished job stays shown.
const finishedJobsKept = time.Hour

// of are u's jobs, newest first, dropping those finished long ago.
func (e *evacuations) of(u *user) []EvacuationJob {
	e.mu.Lock()
	defer e.mu.Unlock()
	keep := e.jobs[:0]
	var out []EvacuationJob
	for _, j := range e.jobs {
		v := j.snapshot()
		if v.FinishedAt != nil && time.Since(*v.FinishedAt) > finishedJobsKept {
			continue
		}
		keep = append(keep, j)
		if u != nil && j.owner == u.key {
			out = append(out, v)
		}
	}
	e.jobs = keep
	slices.Reverse(out)
	return out
}

// running is u's running job on node, if any.
func (e *evacuations) running(u *user, node string) *EvacuationJob {
	for _, j := range e.of(u) {
		if j.Node == node && j.State == EvacuationRunning {
			return &j
		}
	}
	return nil
}

func (e *evacuations) find(u *user, id string) *evacJob {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, j := range e.jobs {
		if j.view.ID == id && u != nil && j.owner == u.key {
			return j
		}
	}
	return nil
}

// startEvacuation starts the job that goes on after first, as the user of
// c, and returns it as it is now.
func (s *Server) startEvacuation(u *user, c client.Client, node string, strategy kaironv1.MigrationStrategy, first *Evacuation) *EvacuationJob {
	ctx, cancel := context.WithCancel(s.ctx)
	now := time.Now()
	s.evacuations.mu.Lock()
	s.evacuations.seq++
	j := &evacJob{owner: u.key, cancel: cancel, view: EvacuationJob{
		ID: fmt.Sprintf("%s-%d", node, s.evacuations.seq), Node: node, Strategy: string(strategy),
		State: EvacuationRunning, StartedBy: u.name, StartedAt: now, UpdatedAt: now, Migrated: []EvacuatedMachine{},
	}}
	s.evacuations.jobs = append(s.evacuations.jobs, j)
	s.evacuations.mu.Unlock()
	s.recordPass(j, first, nil)
	go s.runEvacuation(ctx, j, c, node, strategy)
	v := j.snapshot()
	return &v
}

// recordPass notes a pass (or its error) in j and tells the pages.
func (s *Server) recordPass(j *evacJob, res *Evacuation, err error) {
	j.mu.Lock()
	j.view.UpdatedAt = time.Now()
	if err != nil {
		j.view.LastError = err.Error()
	} else {
		j.view.Passes++
		j.view.LastError = ""
		last := *res
		last.Job = nil // the first pass's answer names the job
		j.view.Last = &last
		j.view.Remaining = res.Machines
		j.view.Migrated = append(j.view.Migrated, res.Created...)
	}
	j.mu.Unlock()
	s.hub.publish("evacuations")
}

func (s *Server) finishEvacuation(j *evacJob, state, reason string) {
	j.mu.Lock()
	now := time.Now()
	j.view.State, j.view.Reason, j.view.FinishedAt, j.view.UpdatedAt = state, reason, &now, now
	j.mu.Unlock()
	j.cancel()
	s.hub.publish("evacuations")
}

// evacuationInputs are the kinds whose changes may let a pass do more.
var evacuationInputs = []string{"machines", "migrations", "disruption-budgets", "nodes"}

func (s *Server) runEvacuation(ctx context.Context, j *evacJob, c client.Client, node string, strategy kaironv1.MigrationStrategy) {
	sub := s.hub.subscribe()
	defer s.hub.unsubscribe(sub)
	poll := time.NewTicker(s.opts.EvacuatePoll)
	defer poll.Stop()
	deadline := time.NewTimer(s.opts.EvacuateTimeout)
	defer deadline.Stop()
	var idleSince time.Time
	if last := j.snapshot().Last; last != nil && idle(last) {
		idleSince = time.Now()
	}
	for {
		// Wait for a change to what the plan reads, or the poll.
		select {
		case <-ctx.Done():
			s.finishCancelled(j)
			return
		case <-deadline.C:
			s.finishEvacuation(j, EvacuationFailed, fmt.Sprintf("gave up after %s with Machines still on node %s", s.opts.EvacuateTimeout, node))
			return
		case <-poll.C:
		case <-sub.wake:
			if !slices.ContainsFunc(sub.take(), func(k string) bool { return slices.Contains(evacuationInputs, k) }) {
				continue
			}
		}
		res, err := evacuatePass(ctx, c, node, strategy)
		switch {
		case ctx.Err() != nil:
			s.finishCancelled(j)
			return
		case err != nil && retriable(err):
			s.recordPass(j, nil, err)
		case err != nil:
			s.recordPass(j, nil, err)
			s.finishEvacuation(j, EvacuationFailed, "the pass was refused: "+err.Error())
			return
		default:
			s.recordPass(j, res, nil)
			if res.Machines == 0 {
				s.finishEvacuation(j, EvacuationEmpty, fmt.Sprintf("node %s is empty", node))
				return
			}
			if !idle(res) {
				idleSince = time.Time{}
			} else if idleSince.IsZero() {
				idleSince = time.Now()
			} else if time.Since(idleSince) >= s.opts.EvacuateStuckAfter {
				s.finishEvacuation(j, EvacuationStuck, stuckReason(res, time.Since(idleSince)))
				return
			}
		}
		// At most one pass a second, however busy the cluster.
		select {
		case <-ctx.Done():
			s.finishCancelled(j)
			return
		case <-time.After(time.Second):
		}
	}
}

func (s *Server) finishCancelled(j *evacJob) {
	if j.snapshot().State == EvacuationRunning {
		s.finishEvacuation(j, EvacuationCancelled, "cancelled")
	}
}

// idle: the pass moved nothing and nothing is moving, so only a change
// from outside (a budget, a Machine's health) can let the next one do more.
func idle(res *Evacuation) bool {
	return len(res.Created) == 0 && len(res.InFlight) == 0 && len(res.Deleting) == 0
}

func stuckReason(res *Evacuation, idleFor time.Duration) string {
	var why []string
	for _, m := range res.Skipped {
		why = append(why, m.Namespace+"/"+m.Name+": "+m.Reason)
	}
	return fmt.Sprintf("nothing can move: for %s no migration was in flight and none could be created; %d Machines left on node %s: %s",
		idleFor.Round(time.Second), res.Machines, res.Node, strings.Join(why, "; "))
}

// retriable errors are passing troubles, not a refusal of the user: a
// pass is tried again. A refusal of kairon-ui's own (the node is gone) is
// not one.
func retriable(err error) bool {
	var ae *actionError
	if errors.As(err, &ae) {
		return false
	}
	return ops.Retriable(err)
}

// cancelEvacuation stops one of the user's jobs.
func (s *Server) cancelEvacuation(ctx context.Context, _ client.Client, req *CancelEvacuationRequest) (*EvacuationJob, error) {
	j := s.evacuations.find(userOf(ctx), req.ID)
	if j == nil {
		return nil, refuse(http.StatusNotFound, "no evacuation %q of yours", req.ID)
	}
	if j.snapshot().State == EvacuationRunning {
		s.finishEvacuation(j, EvacuationCancelled, "cancelled by "+cmpOr(userOf(ctx).name, "you"))
	}
	v := j.snapshot()
	return &v, nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// apiEvacuations lists the user's evacuations until empty.
func (s *Server) apiEvacuations(w http.ResponseWriter, r *http.Request) {
	items := s.evacuations.of(userOf(r.Context()))
	if items == nil {
		items = []EvacuationJob{}
	}
	writeJSON(w, http.StatusOK, List[EvacuationJob]{Items: items, Total: len(items)})
}
