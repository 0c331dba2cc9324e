package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// Kubelet makes, for one node, the DRA calls the kubelet of Kubernetes
// v1.36.3 makes (pkg/kubelet/cm/dra: manager.go prepareResources and
// unprepareResources, plugin/dra_plugin.go, and the plugin watcher's
// registration): it registers the driver through its registration socket
// (GetInfo, then NotifyRegistrationStatus), and for each pod bound to the
// node it fetches the pod's claims, checks that each is reserved for the pod,
// calls NodePrepareResources (v1.DRAPlugin, one batch per driver, 45 s
// timeout) before it reports the pod running, and when the pod is deleted
// calls NodeUnprepareResources for the claims it prepared and then removes
// the pod (terminal phase, then delete with grace period 0, as the kubelet's
// status manager does). A failed call is retried, with the error recorded as the kubelet
// does: an event FailedPrepareDynamicResources on the pod. No container is
// run.
type Kubelet struct {
	Node         string
	RegistrarDir string
	Client       kubernetes.Interface
	DriverName   string

	mu       sync.Mutex
	conn     *grpc.ClientConn
	prepared map[types.UID][]*drapb.Claim // pod UID -> claims prepared
	retryAt  map[types.UID]time.Time      // pod UID -> next try after a failure
	// Hold stops prepares while set (a test opens a window between
	// scheduling and preparation).
	hold bool
	// PrepareTimes are the durations of successful NodePrepareResources calls.
	PrepareTimes []time.Duration
	// Errors are the last error per pod.
	Errors map[types.UID]string
	logf   func(string, ...any)
}

// NewKubelet returns a kubelet stand-in for node.
func NewKubelet(node, registrarDir, driverName string, client kubernetes.Interface, logf func(string, ...any)) *Kubelet {
	return &Kubelet{
		Node: node, RegistrarDir: registrarDir, Client: client, DriverName: driverName,
		prepared: map[types.UID][]*drapb.Claim{}, retryAt: map[types.UID]time.Time{}, Errors: map[types.UID]string{}, logf: logf,
	}
}

// SetHold pauses or resumes prepares.
func (k *Kubelet) SetHold(h bool) {
	k.mu.Lock()
	k.hold = h
	k.mu.Unlock()
}

// register does what the kubelet's plugin watcher and DRA registration
// handler do with a new socket in the registration directory.
func (k *Kubelet) register(ctx context.Context) error {
	sock := filepath.Join(k.RegistrarDir, k.DriverName+"-reg.sock")
	if _, err := os.Stat(sock); err != nil {
		return err
	}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	rc := registerapi.NewRegistrationClient(conn)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	info, err := rc.GetInfo(cctx, &registerapi.InfoRequest{})
	if err != nil {
		return fmt.Errorf("GetInfo: %w", err)
	}
	ok := info.Type == registerapi.DRAPlugin && info.Name == k.DriverName
	supportsV1 := false
	for _, s := range info.SupportedVersions {
		if s == drapb.DRAPluginService {
			supportsV1 = true
		}
	}
	status := &registerapi.RegistrationStatus{PluginRegistered: ok && supportsV1}
	if !status.PluginRegistered {
		status.Error = fmt.Sprintf("unsupported plugin %+v", info)
	}
	if _, err := rc.NotifyRegistrationStatus(cctx, status); err != nil {
		return fmt.Errorf("NotifyRegistrationStatus: %w", err)
	}
	if !status.PluginRegistered {
		return fmt.Errorf("%s", status.Error)
	}
	dc, err := grpc.NewClient("unix://"+info.Endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	k.mu.Lock()
	if k.conn != nil {
		k.conn.Close()
	}
	k.conn = dc
	k.mu.Unlock()
	return nil
}

// Run syncs the node's pods every 200 ms until ctx ends.
func (k *Kubelet) Run(ctx context.Context) {
	for {
		k.mu.Lock()
		registered := k.conn != nil
		k.mu.Unlock()
		if !registered {
			if err := k.register(ctx); err == nil {
				k.logf("kubelet %s: driver %s registered", k.Node, k.DriverName)
			}
		}
		k.syncOnce(ctx)
		select {
		case <-ctx.Done():
			k.mu.Lock()
			if k.conn != nil {
				k.conn.Close()
			}
			k.mu.Unlock()
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Reregister drops the connection so the next sync registers again (as the
// kubelet does when a driver's registration socket is recreated).
func (k *Kubelet) Reregister() {
	k.mu.Lock()
	if k.conn != nil {
		k.conn.Close()
	}
	k.conn = nil
	k.mu.Unlock()
}

func (k *Kubelet) syncOnce(ctx context.Context) {
	pods, err := k.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + k.Node})
	if err != nil {
		return
	}
	for i := range pods.Items {
		pod := &pods.Items[i]
		if pod.DeletionTimestamp != nil {
			k.terminate(ctx, pod)
			continue
		}
		if pod.Status.Phase == v1.PodRunning {
			continue
		}
		k.start(ctx, pod)
	}
}

func (k *Kubelet) start(ctx context.Context, pod *v1.Pod) {
	k.mu.Lock()
	hold, conn, retryAt := k.hold, k.conn, k.retryAt[pod.UID]
	k.mu.Unlock()
	if hold || time.Now().Before(retryAt) {
		return
	}
	var claims []*drapb.Claim
	for i := range pod.Spec.ResourceClaims {
		name, mustCheckOwner, err := resourceclaim.Name(pod, &pod.Spec.ResourceClaims[i])
		if err != nil {
			k.fail(ctx, pod, err)
			return
		}
		if name == nil {
			continue
		}
		claim, err := k.Client.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, *name, metav1.GetOptions{})
		if err != nil {
			k.fail(ctx, pod, fmt.Errorf("fetch ResourceClaim %s: %w", *name, err))
			return
		}
		if mustCheckOwner {
			if err := resourceclaim.IsForPod(pod, claim, false); err != nil {
				k.fail(ctx, pod, err)
				return
			}
		}
		if !resourceclaim.IsReservedForPod(pod, claim, false) {
			k.fail(ctx, pod, fmt.Errorf("pod %s (%s) is not allowed to use ResourceClaim %s (%s)", pod.Name, pod.UID, *name, claim.UID))
			return
		}
		if !usesDriver(claim, k.DriverName) {
			continue
		}
		claims = append(claims, &drapb.Claim{Namespace: claim.Namespace, Uid: string(claim.UID), Name: claim.Name})
	}
	if len(claims) > 0 {
		if conn == nil {
			k.fail(ctx, pod, fmt.Errorf("DRA driver %s is not registered", k.DriverName))
			return
		}
		// Recorded before the call, as the kubelet checkpoints its claim
		// info before NodePrepareResources: a pod deleted after a failed
		// or interrupted prepare is still unprepared.
		k.mu.Lock()
		k.prepared[pod.UID] = claims
		k.mu.Unlock()
		cctx, cancel := context.WithTimeout(ctx, 45*time.Second)
		t0 := time.Now()
		resp, err := drapb.NewDRAPluginClient(conn).NodePrepareResources(cctx, &drapb.NodePrepareResourcesRequest{Claims: claims})
		took := time.Since(t0)
		cancel()
		if err != nil {
			k.lost(err)
			k.fail(ctx, pod, fmt.Errorf("NodePrepareResources: %w", err))
			return
		}
		for _, c := range claims {
			r, ok := resp.Claims[c.Uid]
			if !ok {
				k.fail(ctx, pod, fmt.Errorf("NodePrepareResources skipped ResourceClaim %s", c.Name))
				return
			}
			if r.Error != "" {
				k.fail(ctx, pod, fmt.Errorf("NodePrepareResources failed for ResourceClaim %s: %s", c.Name, r.Error))
				return
			}
		}
		k.mu.Lock()
		k.PrepareTimes = append(k.PrepareTimes, took)
		delete(k.Errors, pod.UID)
		k.mu.Unlock()
		k.logf("kubelet %s: prepared %d claim(s) of pod %s/%s in %s", k.Node, len(claims), pod.Namespace, pod.Name, took.Round(time.Millisecond))
	}
	pod.Status.Phase = v1.PodRunning
	now := metav1.Now()
	pod.Status.StartTime = &now
	pod.Status.Conditions = append(pod.Status.Conditions,
		v1.PodCondition{Type: v1.PodReady, Status: v1.ConditionTrue, LastTransitionTime: now},
		v1.PodCondition{Type: v1.ContainersReady, Status: v1.ConditionTrue, LastTransitionTime: now})
	if _, err := k.Client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		k.logf("kubelet %s: pod status: %v", k.Node, err)
	}
}

func usesDriver(claim *resourceapi.ResourceClaim, driver string) bool {
	if claim.Status.Allocation == nil {
		return false
	}
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver == driver {
			return true
		}
	}
	return false
}

func (k *Kubelet) terminate(ctx context.Context, pod *v1.Pod) {
	k.mu.Lock()
	claims, ok := k.prepared[pod.UID]
	conn := k.conn
	k.mu.Unlock()
	if ok && len(claims) > 0 {
		if conn == nil {
			k.fail(ctx, pod, fmt.Errorf("DRA driver %s is not registered", k.DriverName))
			return
		}
		cctx, cancel := context.WithTimeout(ctx, 45*time.Second)
		resp, err := drapb.NewDRAPluginClient(conn).NodeUnprepareResources(cctx, &drapb.NodeUnprepareResourcesRequest{Claims: claims})
		cancel()
		if err != nil {
			k.lost(err)
			k.fail(ctx, pod, fmt.Errorf("NodeUnprepareResources: %w", err))
			return
		}
		for _, c := range claims {
			if r, ok := resp.Claims[c.Uid]; !ok || r.Error != "" {
				k.fail(ctx, pod, fmt.Errorf("NodeUnprepareResources failed for ResourceClaim %s: %v", c.Name, r))
				return
			}
		}
		k.logf("kubelet %s: unprepared %d claim(s) of pod %s/%s", k.Node, len(claims), pod.Namespace, pod.Name)
	}
	k.mu.Lock()
	delete(k.prepared, pod.UID)
	k.mu.Unlock()
	// The kubelet reports a deleted pod's terminal phase before it removes
	// the pod (the pause container ends with 0 on SIGTERM): the
	// resourceclaim controller then deletes the pod's generated claims.
	if pod.Status.Phase != v1.PodSucceeded && pod.Status.Phase != v1.PodFailed {
		pod.Status.Phase = v1.PodSucceeded
		for i := range pod.Status.Conditions {
			if c := &pod.Status.Conditions[i]; c.Type == v1.PodReady || c.Type == v1.ContainersReady {
				c.Status = v1.ConditionFalse
			}
		}
		if _, err := k.Client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
			k.logf("kubelet %s: pod %s terminal status: %v", k.Node, pod.Name, err)
		}
	}
	uid := pod.UID
	err := k.Client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: new(int64), Preconditions: &metav1.Preconditions{UID: &uid},
	})
	if err != nil && !apierrors.IsNotFound(err) {
		k.logf("kubelet %s: delete pod %s: %v", k.Node, pod.Name, err)
	}
}

func (k *Kubelet) fail(ctx context.Context, pod *v1.Pod, err error) {
	k.mu.Lock()
	prev := k.Errors[pod.UID]
	k.Errors[pod.UID] = err.Error()
	k.retryAt[pod.UID] = time.Now().Add(time.Second)
	k.mu.Unlock()
	if prev == err.Error() {
		return
	}
	k.logf("kubelet %s: pod %s/%s: %v", k.Node, pod.Namespace, pod.Name, err)
	now := metav1.Now()
	_, _ = k.Client.CoreV1().Events(pod.Namespace).Create(ctx, &v1.Event{
		ObjectMeta:     metav1.ObjectMeta{GenerateName: pod.Name + "."},
		InvolvedObject: v1.ObjectReference{Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, APIVersion: "v1"},
		Reason:         "FailedPrepareDynamicResources", Message: err.Error(), Type: v1.EventTypeWarning,
		Source: v1.EventSource{Component: "kubelet", Host: k.Node}, FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}, metav1.CreateOptions{})
}

// lost drops the driver's registration when its socket is gone (the plugin
// watcher of the kubelet notices the socket's removal and the new one).
func (k *Kubelet) lost(err error) {
	if status.Code(err) == codes.Unavailable {
		k.Reregister()
	}
}

// Error is the last error for a pod ("" if none).
func (k *Kubelet) Error(uid types.UID) string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.Errors[uid]
}

// Prepared says whether the kubelet holds prepared claims for the pod.
func (k *Kubelet) Prepared(uid types.UID) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	_, ok := k.prepared[uid]
	return ok
}
