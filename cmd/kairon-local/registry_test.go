package main

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/zyvor/kairon/internal/testenv/host"
	"github.com/zyvor/kairon/internal/userimages"
)

// Where the registry may run is decided before anything starts: on this
// machine only, on a free address; the default address taken means no
// registry, with a warning, rather than no kairon-local.
func TestCheckRegistry(t *testing.T) {
	if _, err := exec.LookPath(registryBinary); err != nil {
		t.Fatalf("%s not installed: run make deps (Debian package docker-registry)", registryBinary)
	}
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	taken := busy.Addr().String()
	free := "127.0.0.1:" + freePort(t)
	tests := []struct {
		name        string
		in          registryOptions
		wantEnabled bool
		wantErr     string
		wantWarning string
	}{
		{name: "off", in: registryOptions{enabled: false, address: "0.0.0.0:1"}},
		{name: "free loopback address", in: registryOptions{enabled: true, address: free}, wantEnabled: true},
		{name: "localhost", in: registryOptions{enabled: true, address: "localhost:" + freePort(t)}, wantEnabled: true},
		{name: "every interface", in: registryOptions{enabled: true, address: ":5000"}, wantErr: `host "" is not a loopback address`},
		{name: "another machine's", in: registryOptions{enabled: true, address: "10.0.0.1:5000", explicit: true}, wantErr: "listens on this machine only"},
		{name: "no port", in: registryOptions{enabled: true, address: "127.0.0.1"}, wantErr: "missing port"},
		{name: "given and taken", in: registryOptions{enabled: true, address: taken, explicit: true}, wantErr: "--registry-address " + taken + ": "},
		{name: "default and taken", in: registryOptions{enabled: true, address: taken}, wantWarning: "the registry's address " + taken + " is taken"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := tt.in
			var warning string
			err := checkRegistry(&o, func(s string) { warning = s })
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if o.enabled != tt.wantEnabled {
				t.Errorf("enabled %t, want %t", o.enabled, tt.wantEnabled)
			}
			if !strings.Contains(warning, tt.wantWarning) || (tt.wantWarning == "") != (warning == "") {
				t.Errorf("warning %q, want one containing %q", warning, tt.wantWarning)
			}
		})
	}
}

// Without docker-registry, a registry asked for on the command line stops
// up; the default one is left out with a warning.
func TestCheckRegistryWithoutDockerRegistry(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	address := "127.0.0.1:" + freePort(t)
	o := registryOptions{enabled: true, address: address, explicit: true}
	if err := checkRegistry(&o, func(string) {}); err == nil || !strings.Contains(err.Error(), "apt-get install docker-registry") {
		t.Errorf("explicit registry without docker-registry: %v", err)
	}
	o = registryOptions{enabled: true, address: address}
	var warning string
	if err := checkRegistry(&o, func(s string) { warning = s }); err != nil || o.enabled || !strings.Contains(warning, "running without a registry") {
		t.Errorf("default registry without docker-registry: %v, enabled %t, warning %q", err, o.enabled, warning)
	}
}

var registryLine = regexp.MustCompile(`\n  (127\.0\.0\.1:\d+/kairon/python:3\.11)@(sha256:[0-9a-f]{64})\n`)

// up runs a registry on the address asked for, with its storage in the
// data dir, and makes sure it holds kairon/python:3.11, which podman pulls
// from it. The registry stops with kairon-local; a second up finds the
// image in the registry's storage and neither builds nor pushes it.
func TestUpRunsARegistryHoldingThePythonImage(t *testing.T) {
	binDir := host.BinDir(t)
	if _, err := exec.LookPath(registryBinary); err != nil {
		t.Fatalf("%s not installed: make deps installs it", registryBinary)
	}
	if _, err := exec.LookPath("podman"); err != nil {
		t.Fatal("podman not installed: make deps installs it")
	}
	exe := buildKaironLocal(t)
	dataDir := t.TempDir()
	address := "127.0.0.1:" + freePort(t)
	args := []string{"--data-dir", dataDir, "--port", "0", "--bin-dir", binDir, "--nodes", "0", "--registry-address", address}

	up := startUp(t, exe, args...)
	out, _ := os.ReadFile(up.stdout)
	m := registryLine.FindSubmatch(out)
	if !bytes.Contains(out, []byte("Registry (OCI, plain HTTP, on this machine only): "+address+"\n")) || m == nil || string(m[1]) != address+"/kairon/python:3.11" {
		t.Fatalf("up does not print the registry %s and the image it holds:\n%s", address, up.output())
	}
	ref, digest := string(m[1]), string(m[2])
	cached, _, err := userimages.Python.Build(t.Context(), userimages.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := cached.Digest(); want.String() != digest {
		t.Errorf("the registry holds %s, the build is %s", digest, want)
	}
	pulled, err := exec.Command("podman", "pull", "-q", "--tls-verify=false", ref).CombinedOutput()
	if err != nil {
		t.Fatalf("podman pull %s: %v\n%s", ref, err, pulled)
	}
	t.Cleanup(func() { _ = exec.Command("podman", "rmi", "--ignore", "-f", ref).Run() })
	if got, err := exec.Command("podman", "image", "inspect", "--format", "{{.Digest}}", ref).Output(); err != nil || strings.TrimSpace(string(got)) != digest {
		t.Errorf("podman pulled digest %q (%v), want %s", got, err, digest)
	}
	if _, err := os.Stat(filepath.Join(registryDir(dataDir), "storage", "docker", "registry", "v2", "repositories", "kairon", "python")); err != nil {
		t.Errorf("the registry's storage is not in the data dir: %v", err)
	}
	up.terminate(t, dataDir) // and nothing of the data dir, the registry included, runs on

	up = startUp(t, exe, args...)
	out, _ = os.ReadFile(up.stdout)
	if m := registryLine.FindSubmatch(out); m == nil || string(m[2]) != digest {
		t.Errorf("after a restart up prints no registry holding %s:\n%s", digest, up.output())
	}
	errOut, _ := os.ReadFile(up.stderr)
	for _, never := range []string{"building kairon/python", "pushing kairon/python"} {
		if bytes.Contains(errOut, []byte(never)) {
			t.Errorf("the second up says %q; the registry held the image already:\n%s", never, errOut)
		}
	}
	up.terminate(t, dataDir)
}

// Build and push progress reaches kairon-local's log one prefixed line at
// a time, however it was written.
func TestPrefixWriter(t *testing.T) {
	var out bytes.Buffer
	w := &prefixWriter{prefix: "kairon-local: ", w: &out}
	for _, s := range []string{"building ", "x ...\npushing", " y\n", "\n", "done\n"} {
		if n, err := w.Write([]byte(s)); err != nil || n != len(s) {
			t.Fatalf("Write(%q) = %d, %v", s, n, err)
		}
	}
	want := "kairon-local: building x ...\nkairon-local: pushing y\nkairon-local: \nkairon-local: done\n"
	if out.String() != want {
		t.Errorf("got %q, want %q", out.String(), want)
	}
}
