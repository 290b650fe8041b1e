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

// What Secrets a pool's pull secrets may be, and the error naming the one
// that is not a docker config.
func TestReadPullSecrets(t *testing.T) {
	basic := base64.StdEncoding.EncodeToString([]byte("alice:pw"))
	dockercfg := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "s"}, Type: corev1.SecretTypeDockercfg,
		Data: map[string][]byte{corev1.DockerConfigKey: []byte(`{"registry.example":{"auth":"` + basic + `"}}`)}}
	tests := []struct {
		name   string
		secret *corev1.Secret
		user   string // for registry.example/team/app
		err    string
	}{
		{name: "dockerconfigjson", secret: dockerConfigSecret("s", `{"auths":{"registry.example":{"username":"alice","password":"pw"}}}`), user: "alice"},
		{name: "auth field and scheme", secret: dockerConfigSecret("s", `{"auths":{"https://registry.example":{"auth":"`+basic+`"}}}`), user: "alice"},
		{name: "dockercfg", secret: dockercfg, user: "alice"},
		{name: "another registry's", secret: dockerConfigSecret("s", `{"auths":{"other.example":{"auth":"`+basic+`"}}}`), user: ""},
		{name: "opaque", secret: &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "s"}, Type: corev1.SecretTypeOpaque},
			err: `imagePullSecrets[1] (secret s): its type is "Opaque", not kubernetes.io/dockerconfigjson or kubernetes.io/dockercfg`},
		{name: "no key", secret: &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "s"}, Type: corev1.SecretTypeDockerConfigJson},
			err: "imagePullSecrets[1] (secret s): it has no .dockerconfigjson"},
		{name: "not JSON", secret: dockerConfigSecret("s", `{"auths":`), err: "imagePullSecrets[1] (secret s): "},
		{name: "bad base64 in auth", secret: dockerConfigSecret("s", `{"auths":{"registry.example":{"auth":"%%%"}}}`), err: "imagePullSecrets[1] (secret s): "},
	}
	ref, err := name.ParseReference("registry.example/team/app:1")
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reader := fake.NewClientBuilder().WithObjects(tt.secret).Build()
			// "gone" does not exist: left out, and named.
			keychain, missing, err := readPullSecrets(context.Background(), reader, "team", []corev1.LocalObjectReference{{Name: "gone"}, {Name: "s"}, {Name: ""}})
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("readPullSecrets: %v, want an error containing %q", err, tt.err)
				}
				if strings.Contains(err.Error(), "pw") || strings.Contains(err.Error(), basic) {
					t.Errorf("the error shows a password: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if strings.Join(missing, ",") != "gone" {
				t.Errorf("missing = %v, want [gone]", missing)
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
				t.Errorf("credential of %q for %s, want %q", cfg.Username, ref, tt.user)
			}
		})
	}
}

// The pool picks a credential the way its members' nodes do
// (images.KeychainFromDockerConfigs): the most specific key of any of its
// secrets, and only for the registry it names.
func TestPullSecretsChooseAsTheNodeDoes(t *testing.T) {
	reader := fake.NewClientBuilder().WithObjects(
		dockerConfigSecret("first", `{"auths":{"registry.example":{"username":"first","password":"1"}}}`),
		dockerConfigSecret("second", `{"auths":{"registry.example/team/app":{"username":"second-app","password":"2"},"other.example:5000":{"username":"other","password":"3"}}}`),
	).Build()
	keychain, _, err := readPullSecrets(context.Background(), reader, "team", []corev1.LocalObjectReference{{Name: "first"}, {Name: "second"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ ref, user string }{
		{"registry.example/team/app:1", "second-app"},
		{"registry.example/elsewhere:1", "first"},
		{"other.example:5000/x:1", "other"},
		{"other.example/x:1", ""},
		{"evil.example/registry.example/x:1", ""},
	} {
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
		if cfg.Username != tt.user {
			t.Errorf("%s: credential of %q, want %q", tt.ref, cfg.Username, tt.user)
		}
	}
}
