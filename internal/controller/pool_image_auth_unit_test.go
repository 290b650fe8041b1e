package controller

import (
	"context"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

func dockerConfigSecret(name, config string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: name},
		Type:       corev1.SecretTypeDockerConfigJson,
		Data:       map[string][]byte{corev1.DockerConfigJsonKey: []byte(config)},
	}
}

func TestParsePullSecret(t *testing.T) {
	basic := base64.StdEncoding.EncodeToString([]byte("alice:pw"))
	tests := []struct {
		name   string
		secret *corev1.Secret
		want   []string // host/path=user:password, in order
		err    string
	}{
		{name: "dockerconfigjson with username and password",
			secret: dockerConfigSecret("s", `{"auths":{"registry.example:5000":{"username":"alice","password":"pw"}}}`),
			want:   []string{"registry.example:5000/=alice:pw"}},
		{name: "auth field, scheme and API version path",
			secret: dockerConfigSecret("s", `{"auths":{"https://Registry.Example/v2/":{"auth":"`+basic+`"}}}`),
			want:   []string{"registry.example/=alice:pw"}},
		{name: "a repository path; Docker Hub's names folded",
			secret: dockerConfigSecret("s", `{"auths":{"registry.example/team/":{"auth":"`+basic+`"},"https://index.docker.io/v1/":{"auth":"`+basic+`"},"docker.io":{"auth":"`+basic+`"}}}`),
			want:   []string{"index.docker.io/=alice:pw", "index.docker.io/=alice:pw", "registry.example/team=alice:pw"}},
		{name: "dockercfg",
			secret: &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s"}, Type: corev1.SecretTypeDockercfg,
				Data: map[string][]byte{corev1.DockerConfigKey: []byte(`{"registry.example":{"auth":"` + basic + `"}}`)}},
			want: []string{"registry.example/=alice:pw"}},
		{name: "opaque", secret: &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s"}, Type: corev1.SecretTypeOpaque},
			err: `its type is "Opaque", not kubernetes.io/dockerconfigjson or kubernetes.io/dockercfg`},
		{name: "no key", secret: &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s"}, Type: corev1.SecretTypeDockerConfigJson},
			err: "it has no .dockerconfigjson"},
		{name: "not JSON", secret: dockerConfigSecret("s", `{"auths":`), err: "its .dockerconfigjson is not a docker config"},
		{name: "bad base64 in auth", secret: dockerConfigSecret("s", `{"auths":{"registry.example":{"auth":"%%%"}}}`),
			err: "its .dockerconfigjson is not a docker config"},
		{name: "no registry", secret: dockerConfigSecret("s", `{"auths":{"https:///v2/":{"username":"a","password":"b"}}}`),
			err: "names no registry"},
		{name: "too large", secret: dockerConfigSecret("s", `{"auths":{}}`+strings.Repeat(" ", pullSecretLimit)),
			err: "more than 1048576"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			creds, err := parsePullSecret(tt.secret)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("parsePullSecret: %v, want an error containing %q", err, tt.err)
				}
				if strings.Contains(err.Error(), "pw") {
					t.Errorf("the error shows a password: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, c := range creds {
				got = append(got, c.host+"/"+c.path+"="+c.auth.Username+":"+c.auth.Password)
			}
			if strings.Join(got, " ") != strings.Join(tt.want, " ") {
				t.Errorf("credentials %v, want %v", got, tt.want)
			}
		})
	}
}

// A credential goes only to the registry (and repository path) it names;
// the first secret with a match wins, and within it the longest path.
func TestPullKeychainResolve(t *testing.T) {
	ctx := context.Background()
	reader := fake.NewClientBuilder().WithObjects(
		dockerConfigSecret("first", `{"auths":{"registry.example":{"username":"first","password":"1"},"registry.example/team/app":{"username":"first-app","password":"1"}}}`),
		dockerConfigSecret("second", `{"auths":{"registry.example":{"username":"second","password":"2"},"other.example:5000":{"username":"other","password":"3"}}}`),
	).Build()
	keychain, missing, err := readPullSecrets(ctx, reader, "team", []corev1.LocalObjectReference{{Name: "first"}, {Name: "gone"}, {Name: "second"}, {Name: ""}})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(missing, ",") != "gone" {
		t.Errorf("missing = %v, want [gone]", missing)
	}
	tests := []struct{ ref, user string }{
		{"registry.example/team/app:1", "first-app"},
		{"registry.example/team/app/sub:1", "first-app"},
		{"registry.example/team/application:1", "first"},
		{"registry.example/elsewhere:1", "first"},
		{"other.example:5000/x:1", "other"},
		{"other.example/x:1", ""},
		{"evil.example/registry.example/x:1", ""},
		{"registry.example.evil.example/x:1", ""},
	}
	for _, tt := range tests {
		ref, err := name.ParseReference(tt.ref)
		if err != nil {
			t.Fatal(err)
		}
		auth, err := keychain.Resolve(ref.Context())
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := auth.Authorization()
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Username != tt.user || (tt.user == "" && auth != authn.Anonymous) {
			t.Errorf("%s: credential of %q, want %q", tt.ref, cfg.Username, tt.user)
		}
	}

	if _, _, err := readPullSecrets(ctx, fake.NewClientBuilder().WithObjects(&corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "opaque"}, Type: corev1.SecretTypeOpaque,
	}).Build(), "team", []corev1.LocalObjectReference{{Name: "ok"}, {Name: "opaque"}}); err == nil ||
		!strings.Contains(err.Error(), "imagePullSecrets[1] (secret opaque): its type is") {
		t.Errorf("an opaque secret: %v, want an error naming imagePullSecrets[1] and its type", err)
	}
}
