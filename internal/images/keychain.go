package images

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	corev1 "k8s.io/api/core/v1"
)

// maxDockerConfigBytes bounds one pull secret's config: a Secret holds at
// most 1 MiB.
const maxDockerConfigBytes = 1 << 20

// dockerHub is the registry go-containerregistry names Docker Hub by; a
// docker config may name it several ways.
const dockerHub = "index.docker.io"

// dockerAuth is one registry's entry in a docker config.
type dockerAuth struct {
	Auth          string `json:"auth"`
	Username      string `json:"username"`
	Password      string `json:"password"`
	IdentityToken string `json:"identitytoken"`
	RegistryToken string `json:"registrytoken"`
}

// credential is one entry, parsed the way kubelet reads a pull secret's:
// a host (whose dot-separated parts may be globs, *.example.com), an
// optional port that must match exactly, and an optional path that the
// repository must start with.
type credential struct {
	host, port, path string
	glob             bool
	auth             authn.AuthConfig
	order            int // secret, then entry: earlier wins a tie
}

// KeychainFromDockerConfigs is a keychain holding the credentials of
// Kubernetes pull secrets: each config is the .dockerconfigjson
// ({"auths": {…}}) or .dockercfg ({…}) of one Secret, in the order of
// the Machine's imagePullSecrets. As kubelet does, a key matches a
// repository by host (globs allowed per part), port and path prefix, and
// the most specific key wins (the longest path, then a host without
// globs, then the earlier secret). A repository no key matches is pulled
// anonymously. An error names the config (from 1) and the cause.
func KeychainFromDockerConfigs(configs ...[]byte) (authn.Keychain, error) {
	var creds []credential
	for i, c := range configs {
		if len(c) > maxDockerConfigBytes {
			return nil, fmt.Errorf("pull secret config %d: %d bytes, more than %d", i+1, len(c), maxDockerConfigBytes)
		}
		var top map[string]json.RawMessage
		if err := json.Unmarshal(c, &top); err != nil {
			return nil, fmt.Errorf("pull secret config %d: not a docker config: %v", i+1, err)
		}
		entries := top
		if raw, ok := top["auths"]; ok {
			entries = nil
			if err := json.Unmarshal(raw, &entries); err != nil {
				return nil, fmt.Errorf("pull secret config %d: auths: %v", i+1, err)
			}
		}
		for key, raw := range entries {
			var a dockerAuth
			if err := json.Unmarshal(raw, &a); err != nil {
				return nil, fmt.Errorf("pull secret config %d: %q: %v", i+1, key, err)
			}
			cred, err := parseCredential(key, a)
			if err != nil {
				return nil, fmt.Errorf("pull secret config %d: %q: %v", i+1, key, err)
			}
			cred.order = len(creds)
			creds = append(creds, cred)
		}
	}
	return &keychain{creds: creds}, nil
}

func parseCredential(key string, a dockerAuth) (credential, error) {
	var c credential
	k := strings.TrimPrefix(strings.TrimPrefix(key, "https://"), "http://")
	hostport, p, _ := strings.Cut(k, "/")
	c.host, c.port = hostport, ""
	if h, port, ok := strings.Cut(hostport, ":"); ok {
		c.host, c.port = h, port
	}
	c.host = strings.ToLower(c.host)
	if c.host == "" {
		return c, fmt.Errorf("no registry host")
	}
	switch c.host {
	case "docker.io", "registry-1.docker.io", dockerHub:
		c.host = dockerHub
	}
	// As docker and kubelet read a key: a path starting with the API's
	// version (https://host/v2/, the form `docker login` wrote) means the
	// host, or the path after it.
	for _, version := range []string{"v1", "v2"} {
		if p == version || strings.HasPrefix(p, version+"/") {
			p = strings.TrimPrefix(p[len(version):], "/")
		}
	}
	c.path = strings.TrimSuffix(p, "/")
	c.glob = strings.ContainsAny(c.host, "*?[")
	if c.glob {
		for _, part := range strings.Split(c.host, ".") {
			if _, err := filepath.Match(part, ""); err != nil {
				return c, fmt.Errorf("bad host pattern: %v", err)
			}
		}
	}
	c.auth = authn.AuthConfig{
		Username:      a.Username,
		Password:      a.Password,
		IdentityToken: a.IdentityToken,
		RegistryToken: a.RegistryToken,
	}
	if a.Auth != "" {
		b, err := base64.StdEncoding.DecodeString(a.Auth)
		if err != nil {
			return c, fmt.Errorf("auth is not base64: %v", err)
		}
		user, pass, ok := strings.Cut(string(b), ":")
		if !ok {
			return c, fmt.Errorf("auth is not user:password")
		}
		c.auth.Username, c.auth.Password = user, pass
	}
	return c, nil
}

type keychain struct{ creds []credential }

// Resolve finds the most specific credential for a registry or repository.
func (k *keychain) Resolve(target authn.Resource) (authn.Authenticator, error) {
	reg := target.RegistryStr()
	host, port := strings.ToLower(reg), ""
	if h, p, ok := strings.Cut(reg, ":"); ok {
		host, port = strings.ToLower(h), p
	}
	repo := strings.TrimPrefix(strings.TrimPrefix(target.String(), reg), "/")
	var best *credential
	for i := range k.creds {
		c := &k.creds[i]
		if !c.matches(host, port, repo) {
			continue
		}
		if best == nil || c.moreSpecific(best) {
			best = c
		}
	}
	if best == nil {
		return authn.Anonymous, nil
	}
	return authn.FromConfig(best.auth), nil
}

func (c *credential) matches(host, port, repo string) bool {
	if c.port != port {
		return false
	}
	if c.glob {
		want, got := strings.Split(c.host, "."), strings.Split(host, ".")
		if len(want) != len(got) {
			return false
		}
		for i := range want {
			if ok, _ := filepath.Match(want[i], got[i]); !ok {
				return false
			}
		}
	} else if c.host != host {
		return false
	}
	return c.path == "" || repo == c.path || strings.HasPrefix(repo, c.path+"/")
}

func (c *credential) moreSpecific(o *credential) bool {
	if len(c.path) != len(o.path) {
		return len(c.path) > len(o.path)
	}
	if c.glob != o.glob {
		return !c.glob
	}
	return c.order < o.order
}

// PullSecretTypes names the Secrets DockerConfigOf reads, for messages.
var PullSecretTypes = fmt.Sprintf("%s (key %s) or %s (key %s)",
	corev1.SecretTypeDockerConfigJson, corev1.DockerConfigJsonKey, corev1.SecretTypeDockercfg, corev1.DockerConfigKey)

// DockerConfigOf is the docker config a pull secret holds, as kubelet
// reads one: the .dockerconfigjson of a kubernetes.io/dockerconfigjson
// Secret, the .dockercfg of a kubernetes.io/dockercfg one. key is the
// data key of the Secret's type ("" for any other type); ok says that it
// holds something. KeychainFromDockerConfigs takes what it returns.
func DockerConfigOf(s *corev1.Secret) (config []byte, key string, ok bool) {
	switch s.Type {
	case corev1.SecretTypeDockerConfigJson:
		key = corev1.DockerConfigJsonKey
	case corev1.SecretTypeDockercfg:
		key = corev1.DockerConfigKey
	default:
		return nil, "", false
	}
	config = s.Data[key]
	return config, key, len(config) > 0
}
