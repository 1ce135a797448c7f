package emulator

import (
	"context"
	"net/http"
	"strconv"
	"time"
)

// task is a long action: the request that starts it answers 202 with a
// task monitor, and the task completes after the BMC's task delay.
type task struct {
	id      string
	name    string
	state   string // New, Running, Completed, Exception
	start   time.Time
	end     time.Time
	message string
}

func (b *BMC) taskDelay() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.faults.SlowTasks > 0 {
		return b.faults.SlowTasks
	}
	return b.e.cfg.TaskDelay
}

// startTask answers 202 Accepted with the task and its monitor, then runs
// work once the task delay has passed.
func (b *BMC) startTask(w http.ResponseWriter, name string, work func(ctx context.Context) error) {
	delay := b.taskDelay()
	b.mu.Lock()
	b.nextTask++
	t := &task{id: strconv.Itoa(b.nextTask), name: name, state: "Running", start: time.Now()}
	b.tasks[t.id] = t
	b.taskOrder = append(b.taskOrder, t.id)
	if !b.closed {
		b.timers = append(b.timers, time.AfterFunc(delay, func() { b.finishTask(t, work) }))
	}
	resource := taskResource(t)
	b.mu.Unlock()
	w.Header().Set("Location", monitorsPath+"/"+t.id)
	writeJSON(w, http.StatusAccepted, resource)
}

func (b *BMC) finishTask(t *task, work func(ctx context.Context) error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	err := work(ctx)
	b.mu.Lock()
	defer b.mu.Unlock()
	t.end = time.Now()
	if err != nil {
		t.state, t.message = "Exception", err.Error()
		return
	}
	t.state, t.message = "Completed", "The task completed successfully."
}

func taskResource(t *task) map[string]any {
	r := odata(tasksPath+"/"+t.id, "#Task.v1_4_3.Task", "Task "+t.name)
	r["Id"] = t.id
	r["TaskState"] = t.state
	r["TaskMonitor"] = monitorsPath + "/" + t.id
	r["StartTime"] = t.start.UTC().Format(time.RFC3339)
	status, percent := "OK", 50
	switch t.state {
	case "Completed":
		percent = 100
	case "Exception":
		status, percent = "Critical", 100
	}
	r["TaskStatus"] = status
	r["PercentComplete"] = percent
	if !t.end.IsZero() {
		r["EndTime"] = t.end.UTC().Format(time.RFC3339)
	}
	messages := []map[string]any{}
	if t.message != "" {
		messages = append(messages, map[string]any{"MessageId": "TaskEvent.1.0." + t.state, "Message": t.message})
	}
	r["Messages"] = messages
	return r
}

func taskService() map[string]any {
	s := odata(rootPath+"/TaskService", "#TaskService.v1_1_4.TaskService", "Task Service")
	s["Id"] = "TaskService"
	s["ServiceEnabled"] = true
	s["CompletedTaskOverWritePolicy"] = "Oldest"
	s["Tasks"] = link(tasksPath)
	return s
}

func (b *BMC) taskCollection() map[string]any {
	b.mu.Lock()
	defer b.mu.Unlock()
	members := make([]string, 0, len(b.taskOrder))
	for _, id := range b.taskOrder {
		members = append(members, tasksPath+"/"+id)
	}
	return collection(tasksPath, "#TaskCollection.TaskCollection", "Task Collection", members...)
}

func (b *BMC) getTask(w http.ResponseWriter, id string) {
	b.mu.Lock()
	t, ok := b.tasks[id]
	var resource map[string]any
	if ok {
		resource = taskResource(t)
	}
	b.mu.Unlock()
	if !ok {
		writeError(w, http.StatusNotFound, "Base.1.8.ResourceMissingAtURI", "No task "+id+".")
		return
	}
	b.writeResource(w, resource)
}

// taskMonitor answers 202 while the task runs and the finished task (200)
// once it is done.
func (b *BMC) taskMonitor(w http.ResponseWriter, id string) {
	b.mu.Lock()
	t, ok := b.tasks[id]
	var resource map[string]any
	running := false
	if ok {
		resource = taskResource(t)
		running = t.state == "New" || t.state == "Running"
	}
	b.mu.Unlock()
	switch {
	case !ok:
		writeError(w, http.StatusNotFound, "Base.1.8.ResourceMissingAtURI", "No task monitor "+id+".")
	case running:
		w.Header().Set("Location", monitorsPath+"/"+id)
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusAccepted, resource)
	default:
		writeJSON(w, http.StatusOK, resource)
	}
}
