// Package e2e runs tiervm's DRA driver against a real Kubernetes control
// plane: etcd, kube-apiserver, kube-scheduler and kube-controller-manager
// (its resourceclaim and serviceaccount controllers), on loopback, started and
// stopped by the test; nodes are `tiervm serve` instances registered as Node
// objects, and the kubelet's DRA calls are made by kubelet.go.
package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Proc is a process the test started, in its own process group.
type Proc struct {
	Name    string
	Cmd     *exec.Cmd
	Log     string
	done    chan struct{}
	err     error
	started time.Time
}

func (p *Proc) startTime() time.Time { return p.started }

// Start runs bin with args, output to dir/name.log.
func Start(dir, name, bin string, args ...string) (*Proc, error) {
	logPath := filepath.Join(dir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Proc{Name: name, Cmd: cmd, Log: logPath, done: make(chan struct{}), started: time.Now().Add(-time.Second)}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// Exited says whether the process ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Stop sends SIGTERM to the process group, waits up to grace, then kills it.
func (p *Proc) Stop(grace time.Duration) {
	if p == nil || p.Exited() {
		return
	}
	_ = syscall.Kill(-p.Cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-p.Cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// Kill sends SIGKILL to the process alone (not its group: a killed
// `tiervm serve` leaves its workers to notice the end of their channel) and
// waits for it.
func (p *Proc) Kill() {
	if p == nil || p.Exited() {
		return
	}
	_ = p.Cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// Tail is the end of the process's log.
func (p *Proc) Tail(n int) string {
	data, _ := os.ReadFile(p.Log)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// ControlPlane is etcd, kube-apiserver, kube-scheduler and
// kube-controller-manager on loopback.
type ControlPlane struct {
	Dir    string
	BinDir string
	Server string // https://127.0.0.1:PORT
	ca     *keyPair
	Admin  *rest.Config
	Client kubernetes.Interface
	Procs  []*Proc
	// cleanup runs after the processes stopped.
	cleanup []func()
}

type keyPair struct {
	cert    *x509.Certificate
	key     *rsa.PrivateKey
	certPEM []byte
	keyPEM  []byte
}

var serial int64 = 1

func newKeyPair(tmpl *x509.Certificate, parent *keyPair) (*keyPair, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	serial++
	tmpl.SerialNumber = big.NewInt(serial)
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(48 * time.Hour)
	signer, signerKey := tmpl, key
	if parent != nil {
		signer, signerKey = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &keyPair{
		cert: cert, key: key,
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM:  pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}),
	}, nil
}

func (cp *ControlPlane) clientCert(user string, groups ...string) (*keyPair, error) {
	return newKeyPair(&x509.Certificate{
		Subject:     pkix.Name{CommonName: user, Organization: groups},
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, cp.ca)
}

// Kubeconfig writes a kubeconfig for a client certificate of user and
// returns its path and rest config.
func (cp *ControlPlane) Kubeconfig(name, user string, groups ...string) (string, *rest.Config, error) {
	kp, err := cp.clientCert(user, groups...)
	if err != nil {
		return "", nil, err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["local"] = &clientcmdapi.Cluster{Server: cp.Server, CertificateAuthorityData: cp.ca.certPEM}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{ClientCertificateData: kp.certPEM, ClientKeyData: kp.keyPEM}
	cfg.Contexts["local"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: name}
	cfg.CurrentContext = "local"
	path := filepath.Join(cp.Dir, name+".kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return "", nil, err
	}
	rc, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return "", nil, err
	}
	rc.QPS, rc.Burst = 100, 200
	return path, rc, nil
}

// FreePort asks the kernel for an unused loopback port.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func writeFile(path string, data []byte) error { return os.WriteFile(path, data, 0o600) }

// StartControlPlane starts etcd and the
// Kubernetes components from binDir, each waited for within a bound.
func StartControlPlane(ctx context.Context, dir, binDir string) (cp *ControlPlane, err error) {
	cp = &ControlPlane{Dir: dir, BinDir: binDir}
	defer func() {
		if err != nil {
			cp.Stop()
		}
	}()
	if cp.ca, err = newKeyPair(&x509.Certificate{
		Subject: pkix.Name{CommonName: "tiervm-e2e-ca"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}, nil); err != nil {
		return nil, err
	}
	serving, err := newKeyPair(&x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, cp.ca)
	if err != nil {
		return nil, err
	}
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	saPub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{
		"ca.crt":      cp.ca.certPEM,
		"serving.crt": serving.certPEM,
		"serving.key": serving.keyPEM,
		"sa.key":      pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(saKey)}),
		"sa.pub":      pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPub}),
	}
	for name, data := range files {
		if err := writeFile(filepath.Join(dir, name), data); err != nil {
			return nil, err
		}
	}
	etcdPort, err := FreePort()
	if err != nil {
		return nil, err
	}
	peerPort, err := FreePort()
	if err != nil {
		return nil, err
	}
	apiPort, err := FreePort()
	if err != nil {
		return nil, err
	}

	// etcd
	// etcd: ETCD_BIN, else the one built with the control plane (the
	// version k8s.io/kubernetes pins), else one on PATH.
	etcdBin := os.Getenv("ETCD_BIN")
	if etcdBin == "" {
		etcdBin = filepath.Join(binDir, "etcd")
		if _, err := os.Stat(etcdBin); err != nil {
			if etcdBin, err = exec.LookPath("etcd"); err != nil {
				return nil, fmt.Errorf("etcd not found in %s or on PATH (set ETCD_BIN)", binDir)
			}
		}
	}
	// etcd's data on tmpfs where there is one: its fsyncs on a loaded
	// disk time requests out, and the data is thrown away anyway.
	etcdData := filepath.Join(dir, "etcd")
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		if d, err := os.MkdirTemp("/dev/shm", "tiervm-e2e-etcd-"); err == nil {
			etcdData = d
			cp.cleanup = append(cp.cleanup, func() { os.RemoveAll(d) })
		}
	}
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", etcdPort)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	p, err := Start(dir, "etcd", etcdBin,
		"--name=e2e", "--data-dir="+etcdData,
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=e2e="+peerURL, "--logger=zap", "--log-level=warn")
	if err != nil {
		return nil, err
	}
	cp.Procs = append(cp.Procs, p)
	if err := waitHTTP(ctx, p, etcdURL+"/health", nil, 30*time.Second); err != nil {
		return nil, err
	}

	// kube-apiserver
	cp.Server = fmt.Sprintf("https://127.0.0.1:%d", apiPort)
	f := func(n string) string { return filepath.Join(dir, n) }
	p, err = Start(dir, "kube-apiserver", filepath.Join(binDir, "kube-apiserver"),
		"--etcd-servers="+etcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", apiPort),
		"--tls-cert-file="+f("serving.crt"), "--tls-private-key-file="+f("serving.key"),
		"--client-ca-file="+f("ca.crt"),
		"--service-account-issuer=https://kubernetes.default.svc", "--service-account-key-file="+f("sa.pub"),
		"--service-account-signing-key-file="+f("sa.key"),
		"--service-cluster-ip-range=10.96.0.0/24", "--endpoint-reconciler-type=none",
		"--authorization-mode=Node,RBAC", "--cert-dir="+f("apiserver-certs"),
		"--runtime-config=resource.k8s.io/v1=true",
	)
	if err != nil {
		return nil, err
	}
	cp.Procs = append(cp.Procs, p)
	adminPath, admin, err := cp.Kubeconfig("admin", "e2e-admin", "system:masters")
	if err != nil {
		return nil, err
	}
	_ = adminPath
	cp.Admin = admin
	tlsCfg, err := rest.TLSConfigFor(admin)
	if err != nil {
		return nil, err
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg}, Timeout: 5 * time.Second}
	if err := waitHTTP(ctx, p, cp.Server+"/readyz", hc, 120*time.Second); err != nil {
		return nil, err
	}
	if cp.Client, err = kubernetes.NewForConfig(admin); err != nil {
		return nil, err
	}

	// kube-scheduler, with its own identity (the bootstrap role
	// system:kube-scheduler covers DRA's objects).
	schedCfg, _, err := cp.Kubeconfig("scheduler", "system:kube-scheduler")
	if err != nil {
		return nil, err
	}
	p, err = Start(dir, "kube-scheduler", filepath.Join(binDir, "kube-scheduler"),
		"--kubeconfig="+schedCfg, "--authentication-kubeconfig="+schedCfg, "--authorization-kubeconfig="+schedCfg,
		"--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=0", "-v=2")
	if err != nil {
		return nil, err
	}
	cp.Procs = append(cp.Procs, p)

	// kube-controller-manager: the resourceclaim controller (claims from
	// templates, reservations, deallocation), service accounts, and the
	// garbage collector (a generated claim whose pod is gone). Its
	// certificate is in system:masters: each controller's own service
	// account would need the token controllers too.
	cmCfg, _, err := cp.Kubeconfig("controller-manager", "system:kube-controller-manager", "system:masters")
	if err != nil {
		return nil, err
	}
	p, err = Start(dir, "kube-controller-manager", filepath.Join(binDir, "kube-controller-manager"),
		"--kubeconfig="+cmCfg, "--authentication-kubeconfig="+cmCfg, "--authorization-kubeconfig="+cmCfg,
		"--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=0",
		"--controllers=resourceclaim-controller,serviceaccount-controller,garbage-collector-controller",
		"--use-service-account-credentials=false", "-v=2")
	if err != nil {
		return nil, err
	}
	cp.Procs = append(cp.Procs, p)
	return cp, nil
}

// Stop stops the components in reverse order.
func (cp *ControlPlane) Stop() {
	for i := len(cp.Procs) - 1; i >= 0; i-- {
		cp.Procs[i].Stop(10 * time.Second)
	}
	for _, f := range cp.cleanup {
		f()
	}
	cp.cleanup = nil
}

// Check reports a component that exited.
func (cp *ControlPlane) Check() error {
	for _, p := range cp.Procs {
		if p.Exited() {
			return fmt.Errorf("%s exited: %v\n%s", p.Name, p.err, p.Tail(30))
		}
	}
	return nil
}

func waitHTTP(ctx context.Context, p *Proc, url string, hc *http.Client, bound time.Duration) error {
	if hc == nil {
		hc = &http.Client{Timeout: 2 * time.Second}
	}
	deadline := time.Now().Add(bound)
	var last string
	for time.Now().Before(deadline) {
		if p.Exited() {
			return fmt.Errorf("%s exited: %v\n%s", p.Name, p.err, p.Tail(30))
		}
		resp, err := hc.Get(url)
		if err == nil {
			var b bytes.Buffer
			_, _ = b.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, b.String())
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s not ready at %s within %s (last: %s)\n%s", p.Name, url, bound, last, p.Tail(30))
}
