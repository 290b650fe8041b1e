package node

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Hardening of the live migration endpoint (issue 10, finding 2).
//
//   - Every agent has its own certificate naming its Node: the Subject CN or
//     a DNS SAN equal to the node name (kairon-local issues CN = DNS SAN =
//     node name). The target accepts a stream only from a peer whose
//     certificate names the migration's status.sourceNode, and the source
//     sends only to a peer whose certificate names status.targetNode.
//   - Plain TCP needs Options.MigrationInsecure (--migration-insecure, for
//     tests), except on a loopback address, which neither guests nor other
//     nodes can reach.
//   - The request must arrive within the handshake timeout, in one line of
//     at most liveLineLimit bytes; at most a few connections may be in that
//     unauthenticated phase at once, and they get a terse refusal.

const (
	// defaultMigrationHandshakeTimeout bounds TLS, the request line and its
	// checks (Options.MigrationHandshakeTimeout).
	defaultMigrationHandshakeTimeout = 10 * time.Second
	// defaultMigrationMaxHandshakes bounds the connections not yet
	// authenticated (Options.MigrationMaxHandshakes); more are closed at once.
	defaultMigrationMaxHandshakes = 8
	// liveRefused is all an unauthenticated peer learns.
	liveRefused = "ERR refused"
)

func (a *Agent) migrationHandshakeTimeout() time.Duration {
	if a.opts.MigrationHandshakeTimeout > 0 {
		return a.opts.MigrationHandshakeTimeout
	}
	return defaultMigrationHandshakeTimeout
}

func (a *Agent) migrationMaxHandshakes() int {
	if a.opts.MigrationMaxHandshakes > 0 {
		return a.opts.MigrationMaxHandshakes
	}
	return defaultMigrationMaxHandshakes
}

// CheckMigrationTransport refuses a live migration listener in plain text:
// it needs tlsDir, or insecure (--migration-insecure, tests only), unless
// listen is a loopback address (reachable from this host only).
func CheckMigrationTransport(listen, tlsDir string, insecure bool) error {
	if listen == "" || tlsDir != "" || insecure {
		return nil
	}
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return fmt.Errorf("--migration-listen %q: %w", listen, err)
	}
	if isLoopbackHost(host) {
		return nil
	}
	return fmt.Errorf("--migration-listen %s without --migration-tls-dir: refusing to accept live migrations in plain TCP "+
		"(anyone reaching the port, guests included, could push a guest); give --migration-tls-dir, or --migration-insecure for tests", listen)
}

// isLoopbackHost tells whether host is a loopback IP or localhost.
func isLoopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// certNamesNode tells whether cert identifies node: its Subject CN or one of
// its DNS SANs is the node name.
func certNamesNode(cert *x509.Certificate, node string) bool {
	if cert == nil || node == "" {
		return false
	}
	return cert.Subject.CommonName == node || slices.Contains(cert.DNSNames, node)
}

// certIdentity describes cert's identities for logs.
func certIdentity(cert *x509.Certificate) string {
	if cert == nil {
		return "no certificate"
	}
	return fmt.Sprintf("CN=%q DNS=%q", cert.Subject.CommonName, cert.DNSNames)
}

// migrationRequest is the first line a peer sends the migration listener.
type migrationRequest struct {
	// protocol is liveProtocol (the source sends a running guest),
	// stateProtocol (the target fetches a cold migration's saved state) or
	// snapshotProtocol (a node fetches a MachineSnapshot's file,
	// machine_snapshot_fetch.go) or templateProtocol (a node fetches a
	// pool template's file for a clone, template_fetch.go).
	protocol string
	key      client.ObjectKey
	// token is the one-time transfer token (migration_token.go).
	token string
}

// parseMigrationRequest reads "<protocol> <namespace> <name> <token>":
// exactly four fields separated by single spaces, a known protocol, a
// namespace that is a DNS label, a name that is a DNS subdomain and a token
// of the right syntax. It is a pure function (fuzzed). Its errors never
// quote the request.
func parseMigrationRequest(line string) (migrationRequest, error) {
	fields := strings.Split(line, " ")
	if len(fields) != 4 || (fields[0] != liveProtocol && fields[0] != stateProtocol && fields[0] != snapshotProtocol && fields[0] != templateProtocol) {
		return migrationRequest{}, errors.New("malformed migration request")
	}
	ns, name, token := fields[1], fields[2], fields[3]
	if len(validation.IsDNS1123Label(ns)) > 0 {
		return migrationRequest{}, errors.New("malformed namespace in migration request")
	}
	if len(validation.IsDNS1123Subdomain(name)) > 0 {
		return migrationRequest{}, errors.New("malformed name in migration request")
	}
	if !validTokenSyntax(token) {
		return migrationRequest{}, errors.New("malformed token in migration request")
	}
	return migrationRequest{protocol: fields[0], key: client.ObjectKey{Namespace: ns, Name: name}, token: token}, nil
}
