package fakech

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/vmchaos/vmchaos/chapi"
)

// MaxPayload is micro-http's request body limit: MAX_PAYLOAD_SIZE (51200
// bytes, micro-http src/server.rs), which CH v53 does not raise (measured:
// conformance TestRowWireFormat).
const MaxPayload = 51200

// response is one answer. A nil body on a non-204 status is sent with
// Content-Length: 0.
type response struct {
	status int
	body   []byte
	close  bool // drop the connection after answering (parse errors)
	// micro: the answer micro-http itself makes (a parse error), with its
	// own Server header rather than the one CH's handlers set.
	micro bool
}

func jsonResponse(status int, v any) *response {
	b, _ := json.Marshal(v)
	return &response{status: status, body: b}
}

// chainResponse is CH's error body: the error chain, outermost first.
func chainResponse(status int, chain ...string) *response { return jsonResponse(status, chain) }

var (
	respNoContent  = &response{status: 204}
	respBadRequest = chainResponse(400, "Bad Request")
	respNotFound   = chainResponse(404, "Not Found")
)

// parseErrorResponse is micro-http's answer to a request it cannot parse: 400
// with its own hand-formatted body (the newline is a raw byte, as in
// micro-http src/server.rs), then fakech drops the connection.
func parseErrorResponse(msg string) *response {
	b := []byte(`{ "error": "` + msg + "\nAll previous unanswered requests will be dropped.\" }")
	return &response{status: 400, body: b, close: true, micro: true}
}

// writeResponse writes micro-http's wire format: no reason phrase, and no
// Content-Length on a 204.
func writeResponse(w io.Writer, r *response) error {
	var b bytes.Buffer
	server := "Cloud Hypervisor API"
	if r.micro {
		server = "Firecracker API" // micro-http's Response::new default
	}
	fmt.Fprintf(&b, "HTTP/1.1 %d \r\nServer: %s\r\nConnection: keep-alive\r\nContent-Type: application/json\r\n", r.status, server)
	if r.status != 204 {
		fmt.Fprintf(&b, "Content-Length: %d\r\n", len(r.body))
	}
	b.WriteString("\r\n")
	if r.status != 204 {
		b.Write(r.body)
	}
	_, err := w.Write(b.Bytes())
	return err
}

// rawRequest is one request off the wire. body nil means "no body": absent
// or Content-Length: 0 (micro-http reads only Content-Length bodies).
type rawRequest struct {
	method string
	path   string
	body   []byte
}

// readRequest reads one request. A non-nil response means the request was
// refused at the transport level (answer it and close); io.EOF means the peer
// closed cleanly.
func readRequest(br *bufio.Reader, w io.Writer) (*rawRequest, *response, error) {
	req, err := http.ReadRequest(br)
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil, io.EOF
		}
		return nil, parseErrorResponse("Invalid request: " + err.Error()), nil
	}
	defer req.Body.Close()
	rr := &rawRequest{method: req.Method, path: req.URL.Path}
	if req.ContentLength > MaxPayload {
		return nil, parseErrorResponse(fmt.Sprintf("Request payload with size %d is larger than the limit of %d allowed by server.", req.ContentLength, MaxPayload)), nil
	}
	if len(req.TransferEncoding) > 0 {
		// micro-http refuses Transfer-Encoding: chunked (RequestError::
		// InvalidRequest; measured on CH v53: conformance TestRowWireFormat).
		return nil, parseErrorResponse("Invalid request."), nil
	}
	if w != nil && req.ContentLength > 0 && strings.EqualFold(req.Header.Get("Expect"), "100-continue") {
		// curl sends this for larger bodies and otherwise waits a second.
		if _, err := io.WriteString(w, "HTTP/1.1 100 Continue\r\n\r\n"); err != nil {
			return nil, nil, err
		}
	}
	if req.ContentLength > 0 {
		rr.body = make([]byte, req.ContentLength)
		if _, err := io.ReadFull(req.Body, rr.body); err != nil {
			return nil, parseErrorResponse("Invalid request: body: " + err.Error()), nil
		}
	}
	return rr, nil, nil
}

type bodyRule int

const (
	bodyNone     bodyRule = iota // GET: a body is a 400
	bodyRefused                  // body-less action: any non-empty body is a 400, even {}
	bodyRequired                 // a JSON body is required
)

type endpoint struct {
	method string
	body   bodyRule
}

// endpoints is the API subset fakech serves; anything else is 404.
var endpoints = map[string]endpoint{
	chapi.EpPing:         {http.MethodGet, bodyNone},
	chapi.EpShutdownVMM:  {http.MethodPut, bodyRefused},
	chapi.EpCreate:       {http.MethodPut, bodyRequired},
	chapi.EpBoot:         {http.MethodPut, bodyRefused},
	chapi.EpShutdown:     {http.MethodPut, bodyRefused},
	chapi.EpReboot:       {http.MethodPut, bodyRefused},
	chapi.EpPowerButton:  {http.MethodPut, bodyRefused},
	chapi.EpPause:        {http.MethodPut, bodyRefused},
	chapi.EpResume:       {http.MethodPut, bodyRefused},
	chapi.EpSnapshot:     {http.MethodPut, bodyRequired},
	chapi.EpRestore:      {http.MethodPut, bodyRequired},
	chapi.EpInfo:         {http.MethodGet, bodyNone},
	"vm.counters":        {http.MethodGet, bodyNone},
	chapi.EpAddNet:       {http.MethodPut, bodyRequired},
	chapi.EpAddDisk:      {http.MethodPut, bodyRequired},
	chapi.EpRemoveDevice: {http.MethodPut, bodyRequired},
	chapi.EpDelete:       {http.MethodPut, bodyRefused},
}

// call is a decoded, valid request: the endpoint and its typed body.
type call struct {
	ep       string
	create   *chapi.VmConfig
	snapshot *chapi.VmSnapshotConfig
	restore  *chapi.RestoreConfig
	net      *chapi.NetConfig
	disk     *chapi.DiskConfig
	remove   *chapi.VmRemoveDevice
}

// decodeCall routes a request and decodes its body. It never touches VMM
// state, so it is the part fuzzed with arbitrary requests.
func decodeCall(r *rawRequest) (*call, *response) {
	name, ok := strings.CutPrefix(r.path, "/api/v1/")
	ep, known := endpoints[name]
	if !ok || !known {
		return nil, respNotFound
	}
	if r.method != ep.method {
		return nil, respBadRequest
	}
	switch ep.body {
	case bodyNone:
		// A GET's body is never read (CH v53 answers vm.info and vmm.ping
		// with a body as without; conformance TestRowWireFormat).
		return &call{ep: name}, nil
	case bodyRefused:
		if len(r.body) > 0 {
			return nil, respBadRequest
		}
		return &call{ep: name}, nil
	}
	if len(r.body) == 0 {
		if name == chapi.EpCreate {
			// VmCreate's handler answers a bare 400, no error chain
			// (vmm/src/api/http/http_endpoint.rs; conformance TestRowWireFormat).
			return nil, &response{status: 400}
		}
		return nil, respBadRequest
	}
	c := &call{ep: name}
	var dst any
	var required []string
	switch name {
	case chapi.EpCreate:
		c.create = &chapi.VmConfig{}
		dst = c.create
	case chapi.EpSnapshot:
		c.snapshot = &chapi.VmSnapshotConfig{}
		dst, required = c.snapshot, []string{"destination_url"}
	case chapi.EpRestore:
		c.restore = &chapi.RestoreConfig{}
		dst, required = c.restore, []string{"source_url"}
	case chapi.EpAddNet:
		c.net = &chapi.NetConfig{}
		dst = c.net
	case chapi.EpAddDisk:
		c.disk = &chapi.DiskConfig{}
		dst = c.disk
	case chapi.EpRemoveDevice:
		c.remove = &chapi.VmRemoveDevice{}
		dst, required = c.remove, []string{"id"}
	}
	if err := json.Unmarshal(r.body, dst); err != nil {
		return nil, chainResponse(400, "Failed to deserialize JSON", err.Error())
	}
	if len(required) > 0 {
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(r.body, &fields); err != nil {
			return nil, chainResponse(400, "Failed to deserialize JSON", err.Error())
		}
		for _, f := range required {
			if _, ok := fields[f]; !ok {
				return nil, chainResponse(400, "Failed to deserialize JSON", "missing field `"+f+"` at line 1 column "+strconv.Itoa(len(r.body)))
			}
		}
	}
	return c, nil
}
