package e2e

import (
	"context"
	"os"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestControlPlane: the harness alone. etcd, kube-apiserver, kube-scheduler
// and kube-controller-manager come up on loopback, the scheduler binds a pod
// to a registered node, and everything stops.
func TestControlPlane(t *testing.T) {
	binDir := os.Getenv("TIERVM_K8S_BIN")
	if binDir == "" {
		need(t, "TIERVM_K8S_BIN (k8s/controlplane/build.sh)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	t0 := time.Now()
	cp, err := StartControlPlane(ctx, t.TempDir(), binDir)
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Stop()
	defer func() {
		if t.Failed() {
			for _, p := range cp.Procs {
				t.Logf("--- %s\n%s", p.Name, p.Tail(25))
			}
		}
	}()
	t.Logf("control plane ready in %s", time.Since(t0).Round(time.Millisecond))
	if err := RegisterNode(ctx, cp.Client, "node-x"); err != nil {
		t.Fatal(err)
	}
	if err := waitFor(ctx, 60*time.Second, "default ServiceAccount", func() (bool, error) {
		_, err := cp.Client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: v1.PodSpec{
		Containers:                   []v1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}},
		AutomountServiceAccountToken: new(bool),
	}}
	if _, err := cp.Client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := waitFor(ctx, 60*time.Second, "pod bound", func() (bool, error) {
		p, err := cp.Client.CoreV1().Pods("default").Get(ctx, "p", metav1.GetOptions{})
		return err == nil && p.Spec.NodeName == "node-x", err
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("scheduler bound the pod to node-x %s after start", time.Since(t0).Round(time.Millisecond))
	if err := cp.Check(); err != nil {
		t.Fatal(err)
	}
}
