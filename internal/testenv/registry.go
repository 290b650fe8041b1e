package testenv

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"golang.org/x/crypto/bcrypt"
)

// RegistryBinary is Debian's build of the CNCF distribution registry 2.8
// (package docker-registry), which StartRegistry runs.
const RegistryBinary = "/usr/bin/docker-registry"

// RegistryOptions configure a test registry.
type RegistryOptions struct {
	// Users, when not empty, turns on basic authentication (an htpasswd
	// file, bcrypt): user name to password. Every user may pull and push
	// every repository.
	Users map[string]string
}

// Registry is a real OCI registry on loopback for one test, with its
// storage in a temporary directory; it is stopped when the test ends.
type Registry struct {
	// Addr is its host:port, 127.0.0.1 and a free port: a reference to one
	// of its images is Addr + "/repo:tag" (Ref).
	Addr string
	// Dir is its storage root.
	Dir string

	users map[string]string
}

// registryStartTimeout bounds how long the registry may take to answer
// its first request; it is up in well under a second on an idle machine.
const registryStartTimeout = 30 * time.Second

// StartRegistry runs a registry (RegistryBinary, `serve CONFIG`) on
// 127.0.0.1 for t and returns once it answers. It fails t, saying how to
// install it, when the binary is missing. Its log goes to t's log.
func StartRegistry(t testing.TB, opts RegistryOptions) *Registry {
	t.Helper()
	if _, err := os.Stat(RegistryBinary); err != nil {
		t.Fatalf("testenv: the test registry needs %s (Debian package docker-registry; make deps installs it): %v", RegistryBinary, err)
	}
	dir := t.TempDir()
	r := &Registry{Dir: filepath.Join(dir, "storage"), users: opts.Users}
	var auth string
	if len(opts.Users) > 0 {
		htpasswd := filepath.Join(dir, "htpasswd")
		var lines []string
		for _, u := range sortedUsers(opts.Users) {
			hash, err := bcrypt.GenerateFromPassword([]byte(opts.Users[u]), bcrypt.MinCost)
			if err != nil {
				t.Fatalf("testenv: registry user %q: %v", u, err)
			}
			lines = append(lines, u+":"+string(hash))
		}
		if err := os.WriteFile(htpasswd, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			t.Fatalf("testenv: %v", err)
		}
		auth = fmt.Sprintf("auth:\n  htpasswd:\n    realm: kairon-test\n    path: %s\n", htpasswd)
	}

	// The port is chosen by binding :0 and releasing it, so another
	// process may take it before the registry binds it: the registry then
	// exits at once and StartRegistry tries another port.
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		addr, err := freeLoopbackAddr()
		if err != nil {
			t.Fatalf("testenv: %v", err)
		}
		config := filepath.Join(dir, "config.yml")
		// The registry's secret signs upload state; any value works for one
		// process.
		body := fmt.Sprintf("version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: %s\n  delete:\n    enabled: true\nhttp:\n  addr: %s\n  secret: kairon-test-registry\n%s", r.Dir, addr, auth)
		if err := os.WriteFile(config, []byte(body), 0o600); err != nil {
			t.Fatalf("testenv: %v", err)
		}
		if lastErr = r.start(t, addr, config); lastErr == nil {
			r.Addr = addr
			return r
		}
	}
	t.Fatalf("testenv: starting the test registry: %v", lastErr)
	return nil
}

// start runs the registry on addr and waits for it to answer /v2/; an
// error means it exited first or never answered.
func (r *Registry) start(t testing.TB, addr, config string) error {
	cmd := exec.Command(RegistryBinary, "serve", config)
	log := NewLogWriter(t)
	var stderr lockedBuffer
	cmd.Stdout = log
	cmd.Stderr = io.MultiWriter(log, &stderr)
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	stop := func() {
		_ = cmd.Process.Kill()
		<-exited
	}
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(registryStartTimeout)
	ticker := time.NewTicker(PollInterval)
	defer ticker.Stop()
	for {
		resp, err := client.Get("http://" + addr + "/v2/")
		if err == nil {
			resp.Body.Close()
			// 401 is an answer too: the registry is up and wants credentials.
			if resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusUnauthorized {
				t.Cleanup(stop)
				return nil
			}
		}
		select {
		case <-exited:
			return fmt.Errorf("registry on %s exited: %s", addr, strings.TrimSpace(stderr.String()))
		case <-ticker.C:
		}
		if time.Now().After(deadline) {
			stop()
			return fmt.Errorf("registry on %s did not answer within %s: %v", addr, registryStartTimeout, err)
		}
	}
}

// Ref is the reference of repoTag ("team/app:1") in r.
func (r *Registry) Ref(repoTag string) string { return r.Addr + "/" + repoTag }

// Auth is an authenticator holding the first (by name) of r's users, or
// anonymous when r has none.
func (r *Registry) Auth() authn.Authenticator {
	users := sortedUsers(r.users)
	if len(users) == 0 {
		return authn.Anonymous
	}
	return &authn.Basic{Username: users[0], Password: r.users[users[0]]}
}

// Push pushes img to r as repoTag ("team/app:1") and returns its manifest
// digest (sha256:…).
func (r *Registry) Push(t testing.TB, repoTag string, img v1.Image) string {
	t.Helper()
	ref := r.parse(t, repoTag)
	if err := remote.Write(ref, img, remote.WithAuth(r.Auth())); err != nil {
		t.Fatalf("testenv: pushing %s: %v", ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatalf("testenv: digest of %s: %v", ref, err)
	}
	return d.String()
}

// PushIndex pushes an image index (and the images it lists) to r as
// repoTag and returns the index's digest.
func (r *Registry) PushIndex(t testing.TB, repoTag string, idx v1.ImageIndex) string {
	t.Helper()
	ref := r.parse(t, repoTag)
	if err := remote.WriteIndex(ref, idx, remote.WithAuth(r.Auth())); err != nil {
		t.Fatalf("testenv: pushing index %s: %v", ref, err)
	}
	d, err := idx.Digest()
	if err != nil {
		t.Fatalf("testenv: digest of %s: %v", ref, err)
	}
	return d.String()
}

func (r *Registry) parse(t testing.TB, repoTag string) name.Reference {
	t.Helper()
	ref, err := name.ParseReference(r.Ref(repoTag))
	if err != nil {
		t.Fatalf("testenv: reference %q: %v", repoTag, err)
	}
	return ref
}

func freeLoopbackAddr() (string, error) {
	l, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func sortedUsers(users map[string]string) []string {
	names := make([]string, 0, len(users))
	for u := range users {
		names = append(names, u)
	}
	sort.Strings(names)
	return names
}

// lockedBuffer keeps the registry's stderr for the error of a failed
// start; the process writes it from its own goroutine.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.buf.Len() < 64<<10 {
		b.buf.Write(p)
	}
	return len(p), nil
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
