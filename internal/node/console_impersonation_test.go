package node

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	authzv1 "k8s.io/api/authorization/v1"

	"github.com/zyvor/kairon/internal/execstream"
	"github.com/zyvor/kairon/internal/testenv"
)

// impersonationReviewer plays RBAC for the impersonation tests and records
// every SubjectAccessReview the agent asks:
//   - token "admin" may exec anywhere itself, and may impersonate users
//     tenant-a and tenant-b, ServiceAccount ns/robot, group team-b, uid
//     u-1 and the extra scopes=s;
//   - token "bob" may exec itself but impersonate no one;
//   - tenant-b (and anyone in group team-b) may exec in namespace ns;
//     tenant-a may not.
type impersonationReviewer struct {
	mu          sync.Mutex
	accessAsked []consoleUser
	impAsked    []string // "requester impersonate target"
}

func (r *impersonationReviewer) reviewToken(_ context.Context, token string) (consoleUser, bool, error) {
	return consoleUser{name: token, groups: []string{"system:authenticated"}}, token == "admin" || token == "bob", nil
}

func (r *impersonationReviewer) mayAccess(_ context.Context, user consoleUser, access machineAccess, namespace, _ string) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.accessAsked = append(r.accessAsked, user)
	switch {
	case user.name == "admin" || user.name == "bob":
		return true, nil
	case namespace != "ns" || access != execMachine:
		return false, nil
	}
	return user.name == "tenant-b" || slices.Contains(user.groups, "team-b"), nil
}

func (r *impersonationReviewer) mayImpersonate(_ context.Context, user consoleUser, target impersonationTarget) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.impAsked = append(r.impAsked, user.name+" impersonate "+target.group+":"+target.String())
	if user.name != "admin" {
		return false, nil
	}
	switch target {
	case impersonationTarget{resource: "users", name: "tenant-a"},
		impersonationTarget{resource: "users", name: "tenant-b"},
		impersonationTarget{resource: "serviceaccounts", namespace: "ns", name: "robot"},
		impersonationTarget{resource: "groups", name: "team-b"},
		impersonationTarget{group: "authentication.k8s.io", resource: "uids", name: "u-1"},
		impersonationTarget{group: "authentication.k8s.io", resource: "userextras", subresource: "scopes", name: "s"}:
		return true, nil
	}
	return false, nil
}

// asked returns and forgets what the agent asked.
func (r *impersonationReviewer) asked() ([]consoleUser, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	access, imp := r.accessAsked, r.impAsked
	r.accessAsked, r.impAsked = nil, nil
	return access, imp
}

// bearerWith sends a bearer token and extra headers.
type bearerWith struct {
	token  string
	header http.Header
}

func (b bearerWith) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	for k, vs := range b.header {
		for _, v := range vs {
			r.Header.Add(k, v)
		}
	}
	return http.DefaultTransport.RoundTrip(r)
}

// TestExecImpersonation (issue 42): a request with Impersonate-* headers
// is authorized and logged as the user it names, once its sender was
// found allowed to impersonate that user, each group, the uid and each
// extra; the SubjectAccessReviews the agent asks show it. Without the
// check, every case below would run as admin or bob, who may exec.
func TestExecImpersonation(t *testing.T) {
	reviewer := &impersonationReviewer{}
	url, guest, logs := execServerWith(t, false, reviewer)
	exec := url + "/v1/machines/ns/vm/exec?command=echo&command=hi"
	run := func(token string, header http.Header) (*execstream.StatusError, error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := execstream.Upgrade(ctx, bearerWith{token, header}, exec, nil)
		var status *execstream.StatusError
		if errors.As(err, &status) {
			return status, nil
		}
		if err != nil {
			return nil, err
		}
		var out strings.Builder
		exit, err := execstream.Run(ctx, conn, execstream.Session{Stdout: &out})
		if err == nil && (exit.Code != 0 || out.String() != "hi\n") {
			err = fmt.Errorf("exit %+v, output %q", exit, out.String())
		}
		return nil, err
	}
	as := func(user string, more ...string) http.Header {
		h := http.Header{"Impersonate-User": {user}}
		for i := 0; i+1 < len(more); i += 2 {
			h.Add(more[i], more[i+1])
		}
		return h
	}

	// (1) An admin impersonating a tenant who may not exec is refused, and
	// the exec SubjectAccessReview was about the tenant.
	status, err := run("admin", as("tenant-a"))
	if err != nil || status == nil || status.Code != http.StatusForbidden {
		t.Errorf("admin as tenant-a: %v %v, want 403", status, err)
	}
	access, imp := reviewer.asked()
	if !slices.Equal(imp, []string{`admin impersonate :users "tenant-a"`}) {
		t.Errorf("admin as tenant-a: impersonation reviews %q, want users tenant-a of admin", imp)
	}
	if len(access) != 1 || access[0].name != "tenant-a" || !slices.Equal(access[0].groups, []string{"system:authenticated"}) {
		t.Errorf("admin as tenant-a: exec reviewed for %+v, want tenant-a in system:authenticated", access)
	}
	if guest.Connections() != 0 {
		t.Errorf("the refused impersonation reached the guest: %d connections", guest.Connections())
	}
	if ok, lines := logs.find(`"refused"`, `"user"="tenant-a"`, `"impersonatedBy"="admin"`, `"needs"="create machines/exec"`); !ok {
		t.Errorf("no log of tenant-a's refusal naming admin; logs:\n%s", lines)
	}

	// (2) Impersonating a tenant who may: it runs, reviewed and logged as
	// the tenant, impersonated by admin.
	if status, err := run("admin", as("tenant-b")); status != nil || err != nil {
		t.Errorf("admin as tenant-b: %v %v, want the exec to run", status, err)
	}
	access, _ = reviewer.asked()
	if len(access) != 1 || access[0].name != "tenant-b" {
		t.Errorf("admin as tenant-b: exec reviewed for %+v, want tenant-b", access)
	}
	testenv.Eventually(t, 10*time.Second, "tenant-b's session log", func() (bool, string) {
		return logs.find(`"session ended"`, `"user"="tenant-b"`, `"impersonatedBy"="admin"`, `"command"="echo hi"`)
	})

	// (3) A user without impersonate permission who sends the headers is
	// refused with what was refused, before any exec review.
	status, err = run("bob", as("tenant-b"))
	if err != nil || status == nil || status.Code != http.StatusForbidden || !strings.Contains(status.Message, `user "bob" may not impersonate users "tenant-b"`) {
		t.Errorf("bob as tenant-b: %v %v, want 403 naming users tenant-b", status, err)
	}
	if access, _ := reviewer.asked(); len(access) != 0 {
		t.Errorf("bob as tenant-b: exec reviewed for %+v before the impersonation was allowed", access)
	}
	if ok, lines := logs.find(`"refused"`, `"user"="bob"`, `"impersonate"="users \"tenant-b\""`); !ok {
		t.Errorf("no log of bob's refused impersonation; logs:\n%s", lines)
	}

	// Groups, uid and extras: each checked, each refusal named, and the
	// exec reviewed with all of them.
	for _, c := range []struct {
		what   string
		header http.Header
		code   int
		msg    string
	}{
		{"a group admin may not impersonate", as("tenant-a", "Impersonate-Group", "team-b", "Impersonate-Group", "admins"), 403, `may not impersonate groups "admins"`},
		{"a uid admin may not impersonate", as("tenant-b", "Impersonate-Uid", "u-2"), 403, `may not impersonate uids "u-2"`},
		{"an extra admin may not impersonate", as("tenant-b", "Impersonate-Extra-Scopes", "t"), 403, `may not impersonate userextras/scopes "t"`},
		{"a group without a user", http.Header{"Impersonate-Group": {"team-b"}}, 400, "Impersonate-Group without Impersonate-User"},
		{"a ServiceAccount admin may not impersonate", as("system:serviceaccount:other:robot"), 403, `may not impersonate serviceaccounts "other/robot"`},
	} {
		status, err := run("admin", c.header)
		if err != nil || status == nil || status.Code != c.code || !strings.Contains(status.Message, c.msg) {
			t.Errorf("%s: %v %v, want %d %q", c.what, status, err, c.code, c.msg)
		}
	}
	reviewer.asked()
	if status, err := run("admin", as("tenant-a", "Impersonate-Group", "team-b", "Impersonate-Uid", "u-1", "Impersonate-Extra-Scopes", "s")); status != nil || err != nil {
		t.Errorf("admin as tenant-a in team-b: %v %v, want the exec to run", status, err)
	}
	access, imp = reviewer.asked()
	want := consoleUser{name: "tenant-a", uid: "u-1", groups: []string{"team-b", "system:authenticated"}, extra: map[string]authzv1.ExtraValue{"scopes": {"s"}}, impersonatedBy: "admin"}
	if len(access) != 1 || !reflect.DeepEqual(access[0], want) {
		t.Errorf("admin as tenant-a in team-b: exec reviewed for %+v, want %+v", access, want)
	}
	// users tenant-a and groups team-b were asked above: their answers
	// come from the cache.
	wantImp := []string{`admin impersonate authentication.k8s.io:userextras/scopes "s"`, `admin impersonate authentication.k8s.io:uids "u-1"`}
	if !slices.Equal(imp, wantImp) {
		t.Errorf("impersonation reviews %q, want %q", imp, wantImp)
	}
	// A ServiceAccount's groups follow from its name.
	if status, err := run("admin", as("system:serviceaccount:ns:robot")); err != nil || status == nil || status.Code != http.StatusForbidden {
		t.Errorf("admin as ns/robot: %v %v, want 403 (the robot may not exec)", status, err)
	}
	access, _ = reviewer.asked()
	if len(access) != 1 || access[0].name != "system:serviceaccount:ns:robot" ||
		!slices.Equal(access[0].groups, []string{"system:serviceaccounts", "system:serviceaccounts:ns", "system:authenticated"}) {
		t.Errorf("admin as ns/robot: exec reviewed for %+v, want the ServiceAccount with its groups", access)
	}
	if n := guest.Requests(); n != 2 {
		t.Errorf("%d sessions reached the guest, want the two allowed", n)
	}
}
