package kaironctl

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// Unit tests of waitFor against a scripted API server: each List and each
// Watch takes the next scripted answer, so every path through the helper
// (the watch resumed, expired, failing, the deadline racing a change) is
// reached on purpose rather than by timing.

// listAnswer is one scripted List: the objects and version, or an error.
type listAnswer struct {
	objs []client.Object
	rv   string
	err  error
}

// watchAnswer is one scripted Watch: the events it delivers, whether the
// server then closes it (else it stays open), or an error.
type watchAnswer struct {
	events []watch.Event
	close  bool
	err    error
}

type scriptedServer struct {
	mu      sync.Mutex
	lists   []listAnswer
	watches []watchAnswer
	// What was asked: the options of every list and watch.
	listed  []metav1.ListOptions
	watched []metav1.ListOptions
}

func (s *scriptedServer) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.listed = append(s.listed, *(&client.ListOptions{}).ApplyOptions(opts).AsListOptions())
	if len(s.lists) == 0 {
		return errors.New("test: no List scripted")
	}
	a := s.lists[0]
	if len(s.lists) > 1 {
		s.lists = s.lists[1:]
	}
	if a.err != nil {
		return a.err
	}
	objs := make([]runtime.Object, len(a.objs))
	for i, o := range a.objs {
		objs[i] = o.DeepCopyObject()
	}
	if err := meta.SetList(list, objs); err != nil {
		return err
	}
	list.SetResourceVersion(a.rv)
	return nil
}

func (s *scriptedServer) Watch(ctx context.Context, list client.ObjectList, opts ...client.ListOption) (watch.Interface, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.watched = append(s.watched, *(&client.ListOptions{}).ApplyOptions(opts).AsListOptions())
	if len(s.watches) == 0 {
		// Nothing more happens: an open watch that never delivers.
		return watch.NewFake(), nil
	}
	a := s.watches[0]
	s.watches = s.watches[1:]
	if a.err != nil {
		return nil, a.err
	}
	w := watch.NewFakeWithChanSize(len(a.events), false)
	for _, ev := range a.events {
		w.Action(ev.Type, ev.Object)
	}
	if a.close {
		w.Stop()
	}
	return w, nil
}

func (s *scriptedServer) watchVersions() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var rvs []string
	for _, o := range s.watched {
		rvs = append(rvs, o.ResourceVersion)
	}
	return rvs
}

func testClaim(rv string, phase kaironv1.MachineClaimPhase, machine string) *kaironv1.MachineClaim {
	return &kaironv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c", ResourceVersion: rv},
		Status:     kaironv1.MachineClaimStatus{Phase: phase, MachineName: machine},
	}
}

func pending(rv string) *kaironv1.MachineClaim { return testClaim(rv, kaironv1.ClaimPending, "") }
func bound(rv string) *kaironv1.MachineClaim   { return testClaim(rv, kaironv1.ClaimBound, "m-1") }

func gone() error {
	return &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: http.StatusGone, Reason: metav1.StatusReasonExpired, Message: "too old resource version"}}
}

func TestWaitForObject(t *testing.T) {
	forbidden := apierrors.NewForbidden(schema.GroupResource{Group: "kairon.zyvor.dev", Resource: "machineclaims"}, "", errors.New("no"))
	for _, tc := range []struct {
		name    string
		lists   []listAnswer
		watches []watchAnswer
		timeout time.Duration
		// want is the error: "" for none, else a text it contains.
		want       string
		wantIs     error
		wantPhase  kaironv1.MachineClaimPhase // of the claim as last seen
		wantWatchs []string                   // the versions the watches started from
	}{{
		name:      "done at the first list: no watch",
		lists:     []listAnswer{{objs: []client.Object{bound("5")}, rv: "5"}},
		wantPhase: kaironv1.ClaimBound,
	}, {
		name:      "done on a change the watch brings",
		lists:     []listAnswer{{objs: []client.Object{pending("5")}, rv: "5"}},
		watches:   []watchAnswer{{events: []watch.Event{{Type: watch.Modified, Object: pending("6")}, {Type: watch.Modified, Object: bound("7")}}}},
		wantPhase: kaironv1.ClaimBound, wantWatchs: []string{"5"},
	}, {
		name:  "a closed watch resumes from the last version seen, a bookmark's too",
		lists: []listAnswer{{objs: []client.Object{pending("5")}, rv: "5"}},
		watches: []watchAnswer{
			{events: []watch.Event{{Type: watch.Modified, Object: pending("6")}}, close: true},
			{events: []watch.Event{{Type: watch.Bookmark, Object: pending("9")}}, close: true},
			{events: []watch.Event{{Type: watch.Modified, Object: bound("10")}}},
		},
		wantPhase: kaironv1.ClaimBound, wantWatchs: []string{"5", "6", "9"},
	}, {
		name: "an expired version lists afresh",
		lists: []listAnswer{
			{objs: []client.Object{pending("5")}, rv: "5"},
			{objs: []client.Object{bound("20")}, rv: "20"},
		},
		watches:   []watchAnswer{{events: []watch.Event{{Type: watch.Error, Object: &gone().(*apierrors.StatusError).ErrStatus}}}},
		wantPhase: kaironv1.ClaimBound, wantWatchs: []string{"5"},
	}, {
		name: "a passing failure to list is retried",
		lists: []listAnswer{
			{err: errors.New("connection refused")},
			{objs: []client.Object{bound("5")}, rv: "5"},
		},
		wantPhase: kaironv1.ClaimBound,
	}, {
		name: "a failed watch lists again",
		lists: []listAnswer{
			{objs: []client.Object{pending("5")}, rv: "5"},
			{objs: []client.Object{bound("8")}, rv: "8"},
		},
		watches:   []watchAnswer{{err: apierrors.NewServiceUnavailable("restarting")}},
		wantPhase: kaironv1.ClaimBound, wantWatchs: []string{"5"},
	}, {
		name:  "forbidden ends the wait at once",
		lists: []listAnswer{{err: forbidden}},
		want:  "forbidden",
	}, {
		name:      "the condition's error ends the wait",
		lists:     []listAnswer{{objs: []client.Object{testClaim("5", kaironv1.ClaimLost, "m-1")}, rv: "5"}},
		wantIs:    errClaimLost,
		wantPhase: kaironv1.ClaimLost,
	}, {
		name:      "deleted: the condition sees nil",
		lists:     []listAnswer{{objs: []client.Object{pending("5")}, rv: "5"}},
		watches:   []watchAnswer{{events: []watch.Event{{Type: watch.Deleted, Object: pending("6")}}}},
		wantIs:    errClaimDeleted,
		wantPhase: kaironv1.ClaimPending, wantWatchs: []string{"5"},
	}, {
		name:      "absent from the start",
		lists:     []listAnswer{{rv: "5"}},
		wantIs:    errClaimDeleted,
		wantPhase: "",
	}, {
		name:    "the timeout passes",
		lists:   []listAnswer{{objs: []client.Object{pending("5")}, rv: "5"}},
		timeout: 50 * time.Millisecond,
		wantIs:  context.DeadlineExceeded, want: "stopped waiting",
		wantPhase: kaironv1.ClaimPending, wantWatchs: []string{"5"},
	}, {
		name: "a change that raced the deadline still counts",
		lists: []listAnswer{
			{objs: []client.Object{pending("5")}, rv: "5"},
			{objs: []client.Object{bound("6")}, rv: "6"},
		},
		timeout:   50 * time.Millisecond,
		wantPhase: kaironv1.ClaimBound, wantWatchs: []string{"5"},
	}, {
		name: "the timeout names the last failure",
		lists: []listAnswer{
			{err: errors.New("connection refused")},
		},
		timeout: 50 * time.Millisecond,
		wantIs:  context.DeadlineExceeded, want: "last error: connection refused",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			s := &scriptedServer{lists: tc.lists, watches: tc.watches}
			timeout := tc.timeout
			if timeout == 0 {
				timeout = time.Minute // only a failing test reaches it
			}
			last, err := waitForObject(context.Background(), s, &kaironv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c"}}, timeout, claimBound)
			switch {
			case tc.want == "" && tc.wantIs == nil && err != nil:
				t.Fatalf("error %v, want none", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("error %v, want one containing %q", err, tc.want)
			case tc.wantIs != nil && !errors.Is(err, tc.wantIs):
				t.Errorf("error %v, want one that is %v", err, tc.wantIs)
			}
			var phase kaironv1.MachineClaimPhase
			if last != nil {
				phase = last.Status.Phase
			}
			if phase != tc.wantPhase {
				t.Errorf("last seen in phase %q, want %q", phase, tc.wantPhase)
			}
			if got := strings.Join(s.watchVersions(), ","); got != strings.Join(tc.wantWatchs, ",") {
				t.Errorf("watched from versions [%s], want [%s]", got, strings.Join(tc.wantWatchs, ","))
			}
			for _, o := range append(s.listed, s.watched...) {
				if o.FieldSelector != "metadata.name=c" {
					t.Errorf("field selector %q, want metadata.name=c", o.FieldSelector)
				}
			}
		})
	}
}

// Waiting on an object just written starts from it: a watch from its
// version, no list unless the watch needs one.
func TestWaitForWritten(t *testing.T) {
	for _, tc := range []struct {
		name       string
		written    *kaironv1.MachineClaim
		lists      []listAnswer
		watches    []watchAnswer
		wantPhase  kaironv1.MachineClaimPhase
		wantLists  int
		wantWatchs []string
	}{{
		name:      "done as written: nothing read",
		written:   bound("5"),
		wantPhase: kaironv1.ClaimBound,
	}, {
		name:       "watched from the written version",
		written:    pending("5"),
		watches:    []watchAnswer{{events: []watch.Event{{Type: watch.Modified, Object: bound("7")}}}},
		wantPhase:  kaironv1.ClaimBound,
		wantWatchs: []string{"5"},
	}, {
		name:       "a version too old to watch from lists",
		written:    pending("5"),
		lists:      []listAnswer{{objs: []client.Object{bound("20")}, rv: "20"}},
		watches:    []watchAnswer{{events: []watch.Event{{Type: watch.Error, Object: &gone().(*apierrors.StatusError).ErrStatus}}}},
		wantPhase:  kaironv1.ClaimBound,
		wantLists:  1,
		wantWatchs: []string{"5"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			s := &scriptedServer{lists: tc.lists, watches: tc.watches}
			last, err := waitForWritten(context.Background(), s, tc.written, time.Minute, claimBound)
			if err != nil {
				t.Fatalf("error %v, want none", err)
			}
			if last == nil || last.Status.Phase != tc.wantPhase {
				t.Errorf("last seen %v, want phase %q", last, tc.wantPhase)
			}
			if len(s.listed) != tc.wantLists {
				t.Errorf("listed %d times, want %d", len(s.listed), tc.wantLists)
			}
			if got := strings.Join(s.watchVersions(), ","); got != strings.Join(tc.wantWatchs, ",") {
				t.Errorf("watched from versions [%s], want [%s]", got, strings.Join(tc.wantWatchs, ","))
			}
		})
	}
}

// A cancelled wait stops at once, without the read after a deadline.
func TestWaitForCancelled(t *testing.T) {
	s := &scriptedServer{lists: []listAnswer{{objs: []client.Object{pending("5")}, rv: "5"}}}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := waitForObject(ctx, s, pending(""), 0, claimBound)
	var stopped *waitError
	if !errors.As(err, &stopped) || !errors.Is(err, context.Canceled) {
		t.Fatalf("error %v, want a waitError for a cancelled context", err)
	}
	if len(s.listed) > 1 {
		t.Errorf("listed %d times after a cancel", len(s.listed))
	}
}

// waitFor on a list: the condition sees every object selected, sorted,
// and objects come and go with the watch's events.
func TestWaitForList(t *testing.T) {
	machine := func(ns, name, rv string) *kaironv1.Machine {
		return &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, ResourceVersion: rv}}
	}
	s := &scriptedServer{
		lists: []listAnswer{{objs: []client.Object{machine("b", "m", "1"), machine("a", "z", "2"), machine("a", "m", "3")}, rv: "3"}},
		watches: []watchAnswer{{events: []watch.Event{
			{Type: watch.Deleted, Object: machine("a", "z", "4")},
			{Type: watch.Added, Object: machine("c", "n", "5")},
			{Type: watch.Deleted, Object: machine("b", "m", "6")},
			{Type: watch.Deleted, Object: machine("a", "m", "7")},
			{Type: watch.Deleted, Object: machine("c", "n", "8")},
		}}},
	}
	var seen []string
	sel := selection{newList: func() client.ObjectList { return &kaironv1.MachineList{} }}
	objs, err := waitFor(context.Background(), s, sel, time.Minute, func(objs []client.Object) (bool, error) {
		var names []string
		for _, o := range objs {
			names = append(names, o.GetNamespace()+"/"+o.GetName())
		}
		seen = append(seen, strings.Join(names, " "))
		return len(objs) == 0, nil
	})
	if err != nil || len(objs) != 0 {
		t.Fatalf("waitFor: %v, %d objects left", err, len(objs))
	}
	want := []string{"a/m a/z b/m", "a/m b/m", "a/m b/m c/n", "a/m c/n", "c/n", ""}
	if strings.Join(seen, "|") != strings.Join(want, "|") {
		t.Errorf("the condition saw\n%q\nwant\n%q", seen, want)
	}
}

// An unstructured object is watched as an unstructured list of its kind;
// a typed one as its typed list.
func TestSelectionOf(t *testing.T) {
	k, _ := lookupKind("budgets")
	sel, err := selectionOf(k.object("ns", "b"))
	if err != nil {
		t.Fatal(err)
	}
	ul, ok := sel.newList().(*unstructured.UnstructuredList)
	if !ok || ul.GetKind() != "MachineDisruptionBudgetList" || ul.GetAPIVersion() != "kairon.zyvor.dev/v1alpha1" {
		t.Errorf("unstructured list %T %v", sel.newList(), sel.newList().GetObjectKind().GroupVersionKind())
	}
	if sel.namespace != "ns" || sel.fields.String() != "metadata.name=b" {
		t.Errorf("selection %q %q", sel.namespace, sel.fields)
	}
	node, _ := lookupKind("nodes")
	if sel, _ := selectionOf(node.object("ignored", "n1")); sel.namespace != "" {
		t.Errorf("a cluster-scoped kind is watched in namespace %q", sel.namespace)
	}
	sel, err = selectionOf(&kaironv1.MachineMigration{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := sel.newList().(*kaironv1.MachineMigrationList); !ok {
		t.Errorf("typed list %T", sel.newList())
	}
}

func TestClaimBound(t *testing.T) {
	for _, tc := range []struct {
		claim *kaironv1.MachineClaim
		done  bool
		err   error
	}{
		{nil, false, errClaimDeleted},
		{testClaim("1", "", ""), false, nil},
		{testClaim("1", kaironv1.ClaimPending, ""), false, nil},
		{testClaim("1", kaironv1.ClaimBound, ""), false, nil}, // no machine named yet
		{testClaim("1", kaironv1.ClaimBound, "m-1"), true, nil},
		{testClaim("1", kaironv1.ClaimLost, "m-1"), false, errClaimLost},
	} {
		done, err := claimBound(tc.claim)
		if done != tc.done || !errors.Is(err, tc.err) {
			name := "nil"
			if tc.claim != nil {
				name = fmt.Sprintf("%q/%q", tc.claim.Status.Phase, tc.claim.Status.MachineName)
			}
			t.Errorf("claimBound(%s) = %v, %v; want %v, %v", name, done, err, tc.done, tc.err)
		}
	}
}
