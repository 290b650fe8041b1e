package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The credentials a pool resolves its template's image with: the
// docker-config Secrets its template's imagePullSecrets name, in the
// pool's namespace, as kubelet reads a Pod's. The controller reads each by
// name (get, never list or watch: it holds no other right on Secrets), and
// a credential goes only to the registry its entry names.

// pullSecretLimit bounds the docker config a Secret may hold; the API
// server's own limit on a Secret is 1 MiB.
const pullSecretLimit = 1 << 20

// pullCredential is one entry of a docker config: the registry host and
// optional repository path it is for, and what to send there.
type pullCredential struct {
	secret string
	host   string
	path   string
	auth   authn.AuthConfig
}

// pullKeychain gives a registry the credential of the first Secret (in
// imagePullSecrets order) that has one for it, the entry with the longest
// matching repository path within that Secret; anonymous when none has.
type pullKeychain struct{ creds []pullCredential }

// Resolve implements authn.Keychain.
func (k pullKeychain) Resolve(target authn.Resource) (authn.Authenticator, error) {
	host := normalizeRegistryHost(target.RegistryStr())
	repo := ""
	if r, ok := target.(name.Repository); ok {
		repo = r.RepositoryStr()
	}
	var best *pullCredential
	for i := range k.creds {
		c := &k.creds[i]
		if best != nil && c.secret != best.secret {
			break
		}
		if c.host != host || (c.path != "" && repo != c.path && !strings.HasPrefix(repo, c.path+"/")) {
			continue
		}
		if best == nil || len(c.path) > len(best.path) {
			best = c
		}
	}
	if best == nil {
		return authn.Anonymous, nil
	}
	return authn.FromConfig(best.auth), nil
}

// readPullSecrets reads the named Secrets of namespace ns into a keychain.
// A Secret that does not exist is left out and named in missing, as
// kubelet goes on without it (a public image needs none); one that exists
// but is no docker config is an error naming it and why.
func readPullSecrets(ctx context.Context, reader client.Reader, ns string, refs []corev1.LocalObjectReference) (keychain pullKeychain, missing []string, err error) {
	for i, ref := range refs {
		if ref.Name == "" {
			continue
		}
		var s corev1.Secret
		if err := reader.Get(ctx, client.ObjectKey{Namespace: ns, Name: ref.Name}, &s); err != nil {
			if apierrors.IsNotFound(err) {
				missing = append(missing, ref.Name)
				continue
			}
			return pullKeychain{}, nil, fmt.Errorf("imagePullSecrets[%d] (secret %s): %w", i, ref.Name, err)
		}
		creds, err := parsePullSecret(&s)
		if err != nil {
			return pullKeychain{}, nil, fmt.Errorf("imagePullSecrets[%d] (secret %s): %w", i, ref.Name, err)
		}
		keychain.creds = append(keychain.creds, creds...)
	}
	return keychain, missing, nil
}

// parsePullSecret reads a kubernetes.io/dockerconfigjson or
// kubernetes.io/dockercfg Secret.
func parsePullSecret(s *corev1.Secret) ([]pullCredential, error) {
	var key string
	switch s.Type {
	case corev1.SecretTypeDockerConfigJson:
		key = corev1.DockerConfigJsonKey
	case corev1.SecretTypeDockercfg:
		key = corev1.DockerConfigKey
	default:
		return nil, fmt.Errorf("its type is %q, not %s or %s", s.Type, corev1.SecretTypeDockerConfigJson, corev1.SecretTypeDockercfg)
	}
	data, ok := s.Data[key]
	switch {
	case !ok:
		return nil, fmt.Errorf("it has no %s", key)
	case len(data) > pullSecretLimit:
		return nil, fmt.Errorf("its %s is %d bytes, more than %d", key, len(data), pullSecretLimit)
	}
	var auths map[string]authn.AuthConfig
	if s.Type == corev1.SecretTypeDockerConfigJson {
		var config struct {
			Auths map[string]authn.AuthConfig `json:"auths"`
		}
		if err := json.Unmarshal(data, &config); err != nil {
			return nil, fmt.Errorf("its %s is not a docker config: %s", key, registryText(err.Error()))
		}
		auths = config.Auths
	} else if err := json.Unmarshal(data, &auths); err != nil {
		return nil, fmt.Errorf("its %s is not a docker config: %s", key, registryText(err.Error()))
	}
	var creds []pullCredential
	// In a fixed order: two keys may name the same registry
	// ("https://r.example" and "r.example"), and the same one must win
	// every time.
	for _, server := range slices.Sorted(maps.Keys(auths)) {
		host, path := splitAuthKey(server)
		if host == "" {
			return nil, fmt.Errorf("its %s names no registry in the entry %q", key, truncate(server, 100))
		}
		creds = append(creds, pullCredential{secret: s.Name, host: host, path: path, auth: auths[server]})
	}
	return creds, nil
}

// splitAuthKey reads a docker config's key the way docker and kubelet
// write them: "registry.example:5000", "https://registry.example/v1/",
// "registry.example/team". The API version path (/v1/, /v2/) is no
// repository.
func splitAuthKey(key string) (host, path string) {
	key = strings.TrimPrefix(strings.TrimPrefix(key, "https://"), "http://")
	host, path, _ = strings.Cut(key, "/")
	path = strings.Trim(path, "/")
	if path == "v1" || path == "v2" {
		path = ""
	}
	return normalizeRegistryHost(host), path
}

// normalizeRegistryHost is host lower-cased, Docker Hub's names folded
// into the one go-containerregistry uses.
func normalizeRegistryHost(host string) string {
	host = strings.ToLower(host)
	switch host {
	case "docker.io", "registry-1.docker.io":
		return name.DefaultRegistry
	}
	return host
}
