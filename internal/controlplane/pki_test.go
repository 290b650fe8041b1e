package controlplane

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"testing"
)

func TestPKIIsReusedAndServesTheServiceNames(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	first, err := ensurePKI(dir)
	if err != nil {
		t.Fatal(err)
	}
	second, err := ensurePKI(dir)
	if err != nil {
		t.Fatal(err)
	}
	for name, pair := range map[string][2]*keyPair{
		"ca": {first.ca, second.ca}, "apiserver": {first.apiServer, second.apiServer},
		"admin": {first.admin, second.admin}, "controller-manager": {first.kcm, second.kcm},
	} {
		if !bytes.Equal(pair[0].certPEM, pair[1].certPEM) {
			t.Errorf("%s certificate was reissued although it was still valid", name)
		}
	}

	roots := x509.NewCertPool()
	roots.AddCert(first.ca.cert)
	for _, host := range []string{"127.0.0.1", "::1", "localhost", "kubernetes", "kubernetes.default",
		"kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "10.96.0.1"} {
		if _, err := first.apiServer.cert.Verify(x509.VerifyOptions{DNSName: host, Roots: roots}); err != nil {
			t.Errorf("apiserver certificate for %s: %v", host, err)
		}
	}
	for _, c := range []struct {
		kp      *keyPair
		cn, org string
	}{
		{first.admin, "kairon-admin", "system:masters"},
		{first.kcm, "system:kube-controller-manager", ""},
	} {
		if _, err := c.kp.cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Errorf("%s client certificate: %v", c.cn, err)
		}
		if c.kp.cert.Subject.CommonName != c.cn || (c.org != "" && c.kp.cert.Subject.Organization[0] != c.org) {
			t.Errorf("client certificate subject = %v, want CN=%s O=%s", c.kp.cert.Subject, c.cn, c.org)
		}
	}
	if !first.apiServer.cert.IPAddresses[len(first.apiServer.cert.IPAddresses)-1].Equal(net.ParseIP("10.96.0.1")) {
		t.Errorf("apiserver IP SANs = %v", first.apiServer.cert.IPAddresses)
	}

	// A new CA (say, ca.crt deleted by hand) must not leave leaves behind
	// that it did not sign.
	if err := os.Remove(filepath.Join(dir, "ca.crt")); err != nil {
		t.Fatal(err)
	}
	third, err := ensurePKI(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := third.apiServer.cert.CheckSignatureFrom(third.ca.cert); err != nil {
		t.Errorf("after a new CA the apiserver certificate is not signed by it: %v", err)
	}
	for _, f := range []string{"ca.key", "apiserver.key", "admin.key", "sa.key"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, err %v; private keys must be 0600", f, st.Mode().Perm(), err)
		}
	}
}

// The node agents' live migration credentials: a tls.crt/tls.key/ca.crt
// directory per agent, whose certificate the cluster CA signed for both
// ends of a mutual TLS connection and which names that agent's node only.
func TestPKIWritesTheMigrationTLSDir(t *testing.T) {
	dataDir := t.TempDir()
	p, err := ensurePKI(filepath.Join(dataDir, "pki"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(p.ca.cert)
	serials := map[string]bool{}
	for _, node := range []string{"node-1", "node-2"} {
		dir, err := EnsureMigrationTLS(dataDir, node)
		if err != nil {
			t.Fatal(err)
		}
		if dir != MigrationTLSDir(dataDir, node) {
			t.Errorf("%s: dir %s, want %s", node, dir, MigrationTLSDir(dataDir, node))
		}
		pair, err := tls.LoadX509KeyPair(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"))
		if err != nil {
			t.Fatal(err)
		}
		caPEM, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
		if err != nil || !bytes.Equal(caPEM, p.ca.certPEM) {
			t.Fatalf("ca.crt is not the cluster CA: %v", err)
		}
		cert, err := x509.ParseCertificate(pair.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		if cert.Subject.CommonName != node || len(cert.DNSNames) != 1 || cert.DNSNames[0] != node {
			t.Errorf("%s: certificate CN %q DNS %q, want the node name only", node, cert.Subject.CommonName, cert.DNSNames)
		}
		serials[cert.SerialNumber.String()] = true
		for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
			if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
				t.Errorf("%s: migration certificate for usage %v: %v", node, usage, err)
			}
		}
		if info, err := os.Stat(filepath.Join(dir, "tls.key")); err != nil || info.Mode().Perm() != 0o600 {
			t.Errorf("tls.key: %v, mode %v; want 0600", err, info.Mode())
		}
		// A second call keeps the certificate.
		if _, err := EnsureMigrationTLS(dataDir, node); err != nil {
			t.Fatal(err)
		}
		again, _ := tls.LoadX509KeyPair(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"))
		if !bytes.Equal(again.Certificate[0], pair.Certificate[0]) {
			t.Errorf("%s: certificate reissued on a second call", node)
		}
	}
	if len(serials) != 2 {
		t.Error("the agents share a certificate")
	}
	if _, err := EnsureMigrationTLS(dataDir, "../escape"); err == nil {
		t.Error("a node name with a path in it was accepted")
	}
}
