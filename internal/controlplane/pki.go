package controlplane

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
)

const (
	caValidity   = 10 * 365 * 24 * time.Hour
	leafValidity = 365 * 24 * time.Hour
	// A leaf this close to expiry is reissued at start, so a data dir that is
	// used now and then never hands out a certificate that dies mid-session.
	leafRenewBefore = 30 * 24 * time.Hour
)

// keyPair is a certificate with its private key, both also kept as PEM so
// they can be embedded in kubeconfigs without re-encoding.
type keyPair struct {
	cert    *x509.Certificate
	key     crypto.Signer
	certPEM []byte
	keyPEM  []byte
}

// leafSpec says what a leaf certificate must contain. A stored leaf that no
// longer matches (for example after an upgrade added a SAN) is reissued.
type leafSpec struct {
	file   string // base name in pki/, without extension
	cn     string
	orgs   []string
	dns    []string
	ips    []net.IP
	usages []x509.ExtKeyUsage
}

// pki is every credential the control plane needs, all under DataDir/pki.
type pki struct {
	dir       string
	ca        *keyPair
	apiServer *keyPair
	etcd      *keyPair
	etcdCli   *keyPair // kube-apiserver's client certificate for etcd
	admin     *keyPair
	kcm       *keyPair
	// controller is kairon-controller's client certificate, kubeletClient
	// the API server's towards node agents (its node proxy).
	controller    *keyPair
	kubeletClient *keyPair
}

// MigrationTLSDir is where the node agent nodeName of kairon-local finds its
// live migration credentials (tls.crt, tls.key, ca.crt: kairon-node's
// --migration-tls-dir), under a data directory. Each agent has its own
// certificate, whose Subject CN and only DNS SAN are the node name: the
// identity the other agents check (a target accepts a guest only from the
// migration's source node, a source sends only to its target node).
func MigrationTLSDir(dataDir, nodeName string) string {
	return filepath.Join(dataDir, "pki", "migration-tls", nodeName)
}

// EnsureMigrationTLS issues (or keeps, while still good) the live migration
// certificate of node agent nodeName, signed by the CA of the data dir's
// PKI (made by the control plane's start), and lays it out in
// MigrationTLSDir the way a kubernetes.io/tls Secret with its CA mounts:
// tls.crt, tls.key, ca.crt. It returns that directory.
func EnsureMigrationTLS(dataDir, nodeName string) (string, error) {
	if errs := validation.IsDNS1123Subdomain(nodeName); len(errs) > 0 {
		return "", fmt.Errorf("node name %q: %s", nodeName, errs[0])
	}
	p := &pki{dir: filepath.Join(dataDir, "pki")}
	ca, err := loadKeyPair(p.path("ca.crt"), p.path("ca.key"))
	if err != nil {
		return "", fmt.Errorf("migration certificate of %s: the cluster CA: %w", nodeName, err)
	}
	kp, err := ensureLeaf(p.dir, ca, migrationLeafSpec(nodeName))
	if err != nil {
		return "", fmt.Errorf("migration certificate of %s: %w", nodeName, err)
	}
	dir := MigrationTLSDir(dataDir, nodeName)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	for name, data := range map[string][]byte{"tls.crt": kp.certPEM, "ca.crt": ca.certPEM} {
		if err := writeFileAtomic(filepath.Join(dir, name), data, 0o644); err != nil {
			return "", err
		}
	}
	return dir, writeFileAtomic(filepath.Join(dir, "tls.key"), kp.keyPEM, 0o600)
}

// migrationLeafSpec is node agent nodeName's live migration certificate.
func migrationLeafSpec(nodeName string) leafSpec {
	return leafSpec{
		file: "node-migration-" + nodeName, cn: nodeName, dns: []string{nodeName},
		usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
}

// nodeLeafSpec is node agent nodeName's client certificate for the API
// server: its user name carries the node name, which the node confinement
// policy confines it to. The DNS SAN is the node name too, so that another
// agent that checks a peer's certificate against a node (the saved-state
// server) can tell which node it is.
func nodeLeafSpec(nodeName string) leafSpec {
	return leafSpec{
		file: "node-" + nodeName, cn: NodeUserPrefix + nodeName, orgs: []string{NodesGroup},
		dns: []string{nodeName}, usages: clientAuth,
	}
}

func (p *pki) path(name string) string { return filepath.Join(p.dir, name) }

var (
	loopbackIPs = []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")}
	// serviceIP is the first address of --service-cluster-ip-range, which the
	// apiserver gives to the "kubernetes" Service; in-cluster clients dial it.
	serviceIP = net.ParseIP("10.96.0.1")
)

func leafSpecs() []leafSpec {
	return []leafSpec{
		{
			file: "apiserver", cn: "kube-apiserver",
			dns: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
				"kubernetes.default.svc.cluster.local"},
			ips:    append(slices.Clone(loopbackIPs), serviceIP),
			usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		},
		{
			// One certificate serves etcd's client and peer listeners and is
			// presented by etcd to its (only) peer, itself: hence both usages.
			file: "etcd", cn: "etcd", dns: []string{"localhost"}, ips: loopbackIPs,
			usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		},
		{file: "apiserver-etcd-client", cn: "kube-apiserver-etcd-client", usages: clientAuth},
		{file: "admin", cn: "kairon-admin", orgs: []string{"system:masters"}, usages: clientAuth},
		{file: "controller-manager", cn: "system:kube-controller-manager", usages: clientAuth},
		{file: "kairon-controller", cn: ControllerUser, orgs: []string{ControllersGroup}, usages: clientAuth},
		{file: "apiserver-kubelet-client", cn: APIServerKubeletClientUser, usages: clientAuth},
	}
}

var clientAuth = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}

// ensurePKI loads the credentials in dir, creating whatever is missing,
// expiring, or not issued by the current CA. A fresh data dir costs a few
// milliseconds with ECDSA; a reused one keeps every file as it was.
func ensurePKI(dir string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	p := &pki{dir: dir}
	ca, err := loadOrCreateCA(p.path("ca.crt"), p.path("ca.key"))
	if err != nil {
		return nil, err
	}
	p.ca = ca
	leaves := map[string]**keyPair{
		"apiserver": &p.apiServer, "etcd": &p.etcd, "apiserver-etcd-client": &p.etcdCli,
		"admin": &p.admin, "controller-manager": &p.kcm,
		"kairon-controller": &p.controller, "apiserver-kubelet-client": &p.kubeletClient,
	}
	for _, spec := range leafSpecs() {
		kp, err := ensureLeaf(dir, ca, spec)
		if err != nil {
			return nil, fmt.Errorf("certificate %s: %w", spec.file, err)
		}
		*leaves[spec.file] = kp
	}
	if err := ensureServiceAccountKey(p.path("sa.key"), p.path("sa.pub")); err != nil {
		return nil, fmt.Errorf("service-account key: %w", err)
	}
	// The certificate all agents once shared (any agent could then pose as
	// any other): gone, each agent has its own (EnsureMigrationTLS).
	for _, old := range []string{"node-migration.crt", "node-migration.key", "migration-tls/tls.crt", "migration-tls/tls.key", "migration-tls/ca.crt"} {
		_ = os.Remove(p.path(old))
	}
	return p, nil
}

func loadOrCreateCA(certFile, keyFile string) (*keyPair, error) {
	if kp, err := loadKeyPair(certFile, keyFile); err == nil && kp.cert.IsCA &&
		time.Until(kp.cert.NotAfter) > leafValidity {
		return kp, nil
	}
	key, err := newKey()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          newSerial(),
		Subject:               pkix.Name{CommonName: "kairon-local-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	kp, err := sign(tmpl, key, tmpl, key)
	if err != nil {
		return nil, err
	}
	return kp, writeKeyPair(kp, certFile, keyFile)
}

func ensureLeaf(dir string, ca *keyPair, spec leafSpec) (*keyPair, error) {
	certFile, keyFile := filepath.Join(dir, spec.file+".crt"), filepath.Join(dir, spec.file+".key")
	if kp, err := loadKeyPair(certFile, keyFile); err == nil && leafStillGood(kp.cert, ca, spec) {
		return kp, nil
	}
	key, err := newKey()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: newSerial(),
		Subject:      pkix.Name{CommonName: spec.cn, Organization: spec.orgs},
		DNSNames:     spec.dns,
		IPAddresses:  spec.ips,
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(leafValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  spec.usages,
	}
	kp, err := sign(tmpl, key, ca.cert, ca.key)
	if err != nil {
		return nil, err
	}
	return kp, writeKeyPair(kp, certFile, keyFile)
}

func leafStillGood(c *x509.Certificate, ca *keyPair, spec leafSpec) bool {
	if c.CheckSignatureFrom(ca.cert) != nil || time.Until(c.NotAfter) < leafRenewBefore {
		return false
	}
	if c.Subject.CommonName != spec.cn || !slices.Equal(c.Subject.Organization, spec.orgs) ||
		!slices.Equal(c.DNSNames, spec.dns) || !slices.Equal(c.ExtKeyUsage, spec.usages) {
		return false
	}
	return slices.EqualFunc(c.IPAddresses, spec.ips, func(a, b net.IP) bool { return a.Equal(b) })
}

func ensureServiceAccountKey(keyFile, pubFile string) error {
	if _, err := os.Stat(keyFile); err == nil {
		if _, err := os.Stat(pubFile); err == nil {
			return nil
		}
	}
	key, err := newKey()
	if err != nil {
		return err
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return err
	}
	if err := writeFileAtomic(keyFile, keyPEM, 0o600); err != nil {
		return err
	}
	return writeFileAtomic(pubFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644)
}

func newKey() (*ecdsa.PrivateKey, error) { return ecdsa.GenerateKey(elliptic.P256(), rand.Reader) }

func newSerial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}

func sign(tmpl *x509.Certificate, key crypto.Signer, parent *x509.Certificate, parentKey crypto.Signer) (*keyPair, error) {
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, key.Public(), parentKey)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return nil, err
	}
	return &keyPair{
		cert:    cert,
		key:     key,
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM:  keyPEM,
	}, nil
}

func encodeKey(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func loadKeyPair(certFile, keyFile string) (*keyPair, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, err
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, errors.New("not PEM")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, err
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, err
	}
	key, ok := k.(crypto.Signer)
	if !ok {
		return nil, errors.New("key cannot sign")
	}
	pub, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return nil, err
	}
	if !bytes.Equal(pub, cert.RawSubjectPublicKeyInfo) {
		return nil, errors.New("key does not match certificate")
	}
	return &keyPair{cert: cert, key: key, certPEM: certPEM, keyPEM: keyPEM}, nil
}

func writeKeyPair(kp *keyPair, certFile, keyFile string) error {
	if err := writeFileAtomic(keyFile, kp.keyPEM, 0o600); err != nil {
		return err
	}
	return writeFileAtomic(certFile, kp.certPEM, 0o644)
}

// writeFileAtomic makes a crash or a full disk leave the old file rather
// than a truncated one that would break the next start.
func writeFileAtomic(name string, data []byte, perm os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(name), "."+filepath.Base(name)+".tmp*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), name)
}
