package kaironctl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// turningAwayServer answers a pool's GET, and turns away the first
// turnAway claim creates as the API server does while it has not loaded a
// new CRD's schema (503, a Status, no Retry-After); later creates succeed.
type turningAwayServer struct {
	turnAway int

	mu    sync.Mutex
	posts []kaironv1.MachineClaim
}

func (s *turningAwayServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	const base = "/apis/kairon.zyvor.dev/v1alpha1/namespaces/team-a/"
	switch {
	case r.Method == http.MethodGet && r.URL.Path == base+"machinepools/agents":
		fmt.Fprint(w, `{"apiVersion":"kairon.zyvor.dev/v1alpha1","kind":"MachinePool","metadata":{"name":"agents","namespace":"team-a","resourceVersion":"3"}}`)
	case r.Method == http.MethodPost && r.URL.Path == base+"machineclaims":
		body, _ := io.ReadAll(r.Body)
		var claim kaironv1.MachineClaim
		if err := json.Unmarshal(body, &claim); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		s.mu.Lock()
		s.posts = append(s.posts, claim)
		n := len(s.posts)
		s.mu.Unlock()
		if n <= s.turnAway {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"Resource kind kairon.zyvor.dev/v1alpha1, Kind=MachineClaim not found. There can be a delay between when CustomResourceDefinitions are created and when they are available.","reason":"ServiceUnavailable","code":503}`)
			return
		}
		claim.ResourceVersion, claim.UID = "7", "0b7c1f1e-5a5e-4c39-9d0c-1f5e0d1c2b3a"
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(&claim)
	default:
		http.Error(w, "unexpected "+r.Method+" "+r.URL.Path, http.StatusTeapot)
	}
}

func (s *turningAwayServer) created() []kaironv1.MachineClaim {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]kaironv1.MachineClaim(nil), s.posts...)
}

func fakeKubeconfig(t *testing.T, server string) string {
	t.Helper()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters: [{name: fake, cluster: {server: %q}}]
users: [{name: anyone, user: {}}]
contexts: [{name: fake, context: {cluster: fake, user: anyone, namespace: team-a}}]
current-context: fake
`, server), 0o600); err != nil {
		t.Fatal(err)
	}
	return kubeconfig
}

// A claim create the API server turns away for a while (a chart installed
// a moment ago) is sent again until it is taken, under the same name, each
// time stamped anew; one turned away for too long fails with the server's
// reason.
func TestClaimCreateTurnedAway(t *testing.T) {
	defer func(d time.Duration) { claimCreateRetryFor = d }(claimCreateRetryFor)
	claimCreateRetryFor = time.Second

	for _, tc := range []struct {
		name     string
		turnAway int
		wantCode int
		want     string // stdout, or a text of the error
	}{
		{name: "taken at the third try", turnAway: 2, wantCode: 0, want: "created"},
		{name: "turned away throughout", turnAway: 1 << 30, wantCode: 1,
			want: "There can be a delay between when CustomResourceDefinitions are created and when they are available. (still turned away after "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := &turningAwayServer{turnAway: tc.turnAway}
			ts := httptest.NewServer(srv)
			defer ts.Close()
			var stdout, stderr bytes.Buffer
			code := Main(context.Background(), []string{"--kubeconfig", fakeKubeconfig(t, ts.URL), "claim", "agents", "--wait", "0"}, &stdout, &stderr)
			if code != tc.wantCode {
				t.Fatalf("exit %d, want %d; stdout %q, stderr %q", code, tc.wantCode, stdout.String(), stderr.String())
			}
			posts := srv.created()
			if tc.wantCode == 0 {
				if len(posts) != tc.turnAway+1 {
					t.Errorf("%d creates, want %d", len(posts), tc.turnAway+1)
				}
				if want := "machineclaim/" + posts[0].Name + " created\n"; stdout.String() != want || stderr.Len() != 0 {
					t.Errorf("stdout %q, stderr %q; want %q and nothing", stdout.String(), stderr.String(), want)
				}
			} else if !strings.Contains(stderr.String(), tc.want) || len(posts) < 2 {
				// At least one more try, however slow the machine: the
				// retry budget starts when the first refusal arrives.
				t.Errorf("stderr %q after %d creates, want it to contain %q after more than one", stderr.String(), len(posts), tc.want)
			}
			stamps := map[string]bool{}
			for _, p := range posts {
				if p.Name != posts[0].Name {
					t.Errorf("create named %q after %q: a create turned away is sent again as it was", p.Name, posts[0].Name)
				}
				stamps[p.Annotations[kaironv1.AnnotationClaimCreatedAt]] = true
			}
			if len(posts) > 1 && len(stamps) != len(posts) {
				t.Errorf("%d creates carried %d different stamps: each is stamped when sent", len(posts), len(stamps))
			}
		})
	}
}

// The stamp's refusal is told from the Status's causes, whichever way the
// API server wrote them, and from no other Invalid.
func TestStampRefused(t *testing.T) {
	gk := schema.GroupKind{Group: kaironv1.GroupVersion.Group, Kind: "MachineClaim"}
	policyDenial := func(message string) error {
		err := apierrors.NewForbidden(schema.GroupResource{Group: gk.Group, Resource: "machineclaims"}, "c", errors.New(message))
		err.ErrStatus.Reason, err.ErrStatus.Code = metav1.StatusReasonInvalid, http.StatusUnprocessableEntity
		err.ErrStatus.Details.Causes = append(err.ErrStatus.Details.Causes, metav1.StatusCause{Message: message})
		return err
	}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"the claim-creation-stamp policy", policyDenial("ValidatingAdmissionPolicy 'kairon-claim-creation-stamp' with binding 'kairon-claim-creation-stamp' denied request: " +
			"metadata.annotations[kairon.zyvor.dev/created-at]: 2026-12-02T12:00:00.000Z is not within a second of the claim's creation"), true},
		{"a field error on the stamp", apierrors.NewInvalid(gk, "c", field.ErrorList{
			field.Invalid(field.NewPath("metadata", "annotations").Key(kaironv1.AnnotationClaimCreatedAt), "x", "not a time")}), true},
		{"a field error elsewhere", apierrors.NewInvalid(gk, "c", field.ErrorList{
			field.Required(field.NewPath("spec", "poolName"), "")}), false},
		{"another policy", policyDenial("ValidatingAdmissionPolicy 'p' denied request: spec.poolName: not allowed"), false},
		{"a Forbidden naming the stamp", apierrors.NewForbidden(schema.GroupResource{Resource: "machineclaims"}, "c",
			errors.New("metadata.annotations[kairon.zyvor.dev/created-at]: no")), false},
		{"not an API error", errors.New("metadata.annotations[kairon.zyvor.dev/created-at]: no"), false},
	} {
		if got := stampRefused(fmt.Errorf("creating: %w", tc.err)); got != tc.want {
			t.Errorf("%s: stampRefused = %v, want %v (%v)", tc.name, got, tc.want, tc.err)
		}
	}
}
