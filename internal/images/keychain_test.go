package images

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
)

func basicAuth(user, pass string) string {
	return base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
}

func TestKeychainFromDockerConfigs(t *testing.T) {
	configJSON := `{"auths": {
		"registry.example.com": {"auth": "` + basicAuth("host", "pw1") + `"},
		"registry.example.com/team": {"username": "team", "password": "pw2"},
		"https://registry.example.com/team/app/v1/": {"auth": "` + basicAuth("ignored", "x") + `"},
		"*.corp.example": {"auth": "` + basicAuth("glob", "pw3") + `"},
		"a.corp.example": {"auth": "` + basicAuth("exact", "pw4") + `"},
		"127.0.0.1:5000": {"auth": "` + basicAuth("local", "pw5") + `"},
		"https://index.docker.io/v1/": {"auth": "` + basicAuth("hub", "pw6") + `"},
		"tok.example.com": {"identitytoken": "refresh"},
		"https://login.example.com/v2/": {"auth": "` + basicAuth("login", "pw9") + `"}
	}}`
	legacy := `{"registry.example.com": {"auth": "` + basicAuth("legacy", "pw7") + `"}, "old.example.com": {"auth": "` + basicAuth("old", "pw8") + `"}}`
	kc, err := KeychainFromDockerConfigs([]byte(configJSON), []byte(legacy))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		ref  string
		want authn.AuthConfig // zero: anonymous
	}{
		{ref: "registry.example.com/other/app", want: authn.AuthConfig{Username: "host", Password: "pw1"}},
		{ref: "registry.example.com/team/app", want: authn.AuthConfig{Username: "team", Password: "pw2"}},
		{ref: "registry.example.com/team/app/v1/x", want: authn.AuthConfig{Username: "ignored", Password: "x"}},
		{ref: "registry.example.com/teamx/app", want: authn.AuthConfig{Username: "host", Password: "pw1"}},
		{ref: "b.corp.example/app", want: authn.AuthConfig{Username: "glob", Password: "pw3"}},
		{ref: "a.corp.example/app", want: authn.AuthConfig{Username: "exact", Password: "pw4"}},
		{ref: "x.y.corp.example/app"},
		{ref: "127.0.0.1:5000/team/app", want: authn.AuthConfig{Username: "local", Password: "pw5"}},
		{ref: "127.0.0.1:5001/team/app"},
		{ref: "docker.io/library/debian", want: authn.AuthConfig{Username: "hub", Password: "pw6"}},
		{ref: "tok.example.com/app", want: authn.AuthConfig{IdentityToken: "refresh"}},
		{ref: "old.example.com/app", want: authn.AuthConfig{Username: "old", Password: "pw8"}},
		{ref: "elsewhere.example.com/app"},
		// `docker login`'s form: the API version's path is the host.
		{ref: "login.example.com/team/app", want: authn.AuthConfig{Username: "login", Password: "pw9"}},
	} {
		t.Run(tc.ref, func(t *testing.T) {
			ref, err := name.ParseReference(tc.ref)
			if err != nil {
				t.Fatal(err)
			}
			a, err := kc.Resolve(ref.Context())
			if err != nil {
				t.Fatal(err)
			}
			if tc.want == (authn.AuthConfig{}) {
				if a != authn.Anonymous {
					t.Fatalf("got %v, want anonymous", a)
				}
				return
			}
			got, err := a.Authorization()
			if err != nil {
				t.Fatal(err)
			}
			if *got != tc.want {
				t.Fatalf("got %+v, want %+v", *got, tc.want)
			}
		})
	}
}

func TestKeychainFromDockerConfigsErrors(t *testing.T) {
	for _, tc := range []struct {
		config, want string
	}{
		{`not json`, "pull secret config 2: not a docker config"},
		{`{"auths": []}`, "pull secret config 2: auths"},
		{`{"auths": {"r.example.com": {"auth": "%%%"}}}`, `pull secret config 2: "r.example.com": auth is not base64`},
		{`{"auths": {"r.example.com": {"auth": "` + base64.StdEncoding.EncodeToString([]byte("nocolon")) + `"}}}`, "auth is not user:password"},
		{`{"auths": {"[.example.com": {}}}`, "bad host pattern"},
		{`{"auths": {"": {}}}`, "no registry host"},
	} {
		_, err := KeychainFromDockerConfigs([]byte(`{"auths":{}}`), []byte(tc.config))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("config %s: got %v, want an error containing %q", tc.config, err, tc.want)
		}
	}
}

func TestPlainHTTPOnlyToLoopbackAndInsecure(t *testing.T) {
	g := &guardedTransport{insecure: []string{"registry.lan:5000"}}
	for host, want := range map[string]bool{
		"127.0.0.1:5000":       true,
		"127.8.9.10":           true,
		"[::1]:5000":           true,
		"localhost:5000":       true,
		"registry.lan:5000":    true,
		"registry.lan:5001":    false,
		"10.0.0.5:5000":        false, // go-containerregistry would
		"192.168.1.2":          false,
		"evil.localhost:80":    false,
		"registry.example.com": false,
	} {
		if got := g.allowsHTTP(host); got != want {
			t.Errorf("allowsHTTP(%q) = %v, want %v", host, got, want)
		}
	}
}
