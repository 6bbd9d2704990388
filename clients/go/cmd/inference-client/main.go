// Command inference-client is a small example client for inference.v1.InferenceService.
//
// It asks GetModelInfo what the server runs (printing the model name and
// context size) and CountTokens how long the prompt is, streams one Generate
// request (printing the text as it arrives, then the done event's finish
// reason, usage and timing; the prompt_tokens must equal the count) and makes
// one GenerateJSON call (printing the JSON document). It exits non-zero on any
// failure, except that a GenerateJSON answered with UNIMPLEMENTED is reported
// and tolerated.
//
// TLS: -tls-ca (CA of the server's certificate), -tls-cert/-tls-key (client
// certificate for mTLS). A bearer token: -token, or $INFERENCE_TOKEN; it is sent
// as "authorization: Bearer <token>" metadata (docs/security.md).
//
// Build it with clients/go/build.sh (offline, from Debian's Go packages).
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	inferencev1 "example.com/inference/gen/inference/v1"
)

const personSchema = `{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}},"required":["name","age"]}`

func main() {
	addr := flag.String("addr", "localhost:50051", "server address, host:port")
	prompt := flag.String("prompt", "Once upon a time, a lighthouse keeper", "prompt for the streaming Generate call")
	maxTokens := flag.Int("max-tokens", 32, "max_tokens for the Generate call")
	jsonPrompt := flag.String("json-prompt", "Describe a person named Alice who is 30 years old as JSON.", "prompt for the GenerateJSON call")
	timeout := flag.Duration("timeout", 120*time.Second, "deadline of each call")
	skipJSON := flag.Bool("skip-json", false, "skip the GenerateJSON call")
	tlsCA := flag.String("tls-ca", "", "use TLS, trusting this CA bundle (PEM)")
	tlsCert := flag.String("tls-cert", "", "client certificate for mTLS (PEM; with -tls-key)")
	tlsKey := flag.String("tls-key", "", "key of -tls-cert (PEM)")
	flag.StringVar(&bearerToken, "token", os.Getenv("INFERENCE_TOKEN"), "bearer token (default $INFERENCE_TOKEN)")
	flag.Parse()

	var err error
	if transport, err = transportOption(*tlsCA, *tlsCert, *tlsKey); err != nil {
		fmt.Fprintf(os.Stderr, "go-client: FAILED: %v\n", err)
		os.Exit(1)
	}

	if err := run(*addr, *prompt, int32(*maxTokens), *jsonPrompt, *timeout, *skipJSON); err != nil {
		fmt.Fprintf(os.Stderr, "go-client: FAILED: %v\n", err)
		os.Exit(1)
	}
	fmt.Println("go-client: OK")
}

func run(addr, prompt string, maxTokens int32, jsonPrompt string, timeout time.Duration, skipJSON bool) error {
	dialCtx, cancelDial := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancelDial()
	conn, err := grpc.DialContext(dialCtx, addr, transport, grpc.WithBlock())
	if err != nil {
		return fmt.Errorf("connect to %s: %w", addr, err)
	}
	defer conn.Close()
	client := inferencev1.NewInferenceServiceClient(conn)

	if err := modelInfo(client, timeout); err != nil {
		return fmt.Errorf("GetModelInfo: %w", err)
	}
	promptTokens, err := countTokens(client, prompt, timeout)
	if err != nil {
		return fmt.Errorf("CountTokens: %w", err)
	}
	if err := generate(client, prompt, maxTokens, promptTokens, timeout); err != nil {
		return fmt.Errorf("Generate: %w", err)
	}
	if skipJSON {
		return nil
	}
	return generateJSON(client, jsonPrompt, timeout)
}

var (
	transport   = grpc.WithInsecure()
	bearerToken string
)

// transportOption is plaintext without a CA, else TLS (with a client certificate for mTLS).
func transportOption(caFile, certFile, keyFile string) (grpc.DialOption, error) {
	if caFile == "" && certFile == "" {
		return grpc.WithInsecure(), nil
	}
	config := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, err
		}
		config.RootCAs = x509.NewCertPool()
		if !config.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("no certificate in %s", caFile)
		}
	}
	if certFile != "" {
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, err
		}
		config.Certificates = []tls.Certificate{pair}
	}
	return grpc.WithTransportCredentials(credentials.NewTLS(config)), nil
}

// callContext is a context with the deadline and, if there is a token, the authorization metadata.
func callContext(timeout time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	if bearerToken != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+bearerToken)
	}
	return ctx, cancel
}

// modelInfo prints what the server runs: the model, its context and vocabulary.
func modelInfo(client inferencev1.InferenceServiceClient, timeout time.Duration) error {
	ctx, cancel := callContext(timeout)
	defer cancel()
	info, err := client.GetModelInfo(ctx, &inferencev1.GetModelInfoRequest{})
	if err != nil {
		return err
	}
	fmt.Printf("[info] model=%q file=%s architecture=%s parameters=%d quantization=%s\n",
		info.GetName(), info.GetFileName(), info.GetArchitecture(), info.GetParameterCount(), info.GetQuantization())
	fmt.Printf("[info] context=%d (trained %d) vocab=%d max_running=%d server=%s\n",
		info.GetLimits().GetContextSize(), info.GetTrainingContext(), info.GetVocabSize(), info.GetMaxRunning(),
		info.GetServerVersion())
	if info.GetFileName() == "" || info.GetLimits().GetContextSize() == 0 || info.GetVocabSize() == 0 {
		return fmt.Errorf("model info lacks the file name, context size or vocabulary size")
	}
	return nil
}

// countTokens returns the number of tokens Generate will prefill for the prompt.
func countTokens(client inferencev1.InferenceServiceClient, prompt string, timeout time.Duration) (uint32, error) {
	ctx, cancel := callContext(timeout)
	defer cancel()
	resp, err := client.CountTokens(ctx, &inferencev1.CountTokensRequest{Text: prompt})
	if err != nil {
		return 0, err
	}
	fmt.Printf("[count] prompt_tokens=%d max_new_tokens=%d\n", resp.GetCount(), resp.GetMaxNewTokens())
	return resp.GetCount(), nil
}

// generate sends one request on a Generate stream and prints its events.
func generate(client inferencev1.InferenceServiceClient, prompt string, maxTokens int32, promptTokens uint32, timeout time.Duration) error {
	ctx, cancel := callContext(timeout)
	defer cancel()
	stream, err := client.Generate(ctx)
	if err != nil {
		return err
	}
	const id = "go-1"
	req := &inferencev1.GenerateRequest{
		RequestId: id,
		Prompt:    prompt,
		Sampling: &inferencev1.SamplingParams{
			MaxTokens:   proto.Int32(maxTokens),
			Temperature: proto.Float32(0.7),
			Seed:        proto.Uint64(42),
		},
		Priority: inferencev1.Priority_PRIORITY_INTERACTIVE,
	}
	if err := stream.Send(req); err != nil {
		if err == io.EOF { // the server ended the stream (e.g. UNAUTHENTICATED): its status comes from Recv
			_, err = stream.Recv()
			return fmt.Errorf("recv: %w", err)
		}
		return fmt.Errorf("send: %w", err)
	}
	fmt.Printf("[generate] request_id=%s prompt=%q max_tokens=%d\n", id, prompt, maxTokens)

	deltas := 0
	for {
		resp, err := stream.Recv()
		if err == io.EOF {
			return fmt.Errorf("stream ended before the done event")
		}
		if err != nil {
			return fmt.Errorf("recv: %w", err)
		}
		if resp.GetRequestId() != id {
			return fmt.Errorf("event for unknown request_id %q", resp.GetRequestId())
		}
		switch ev := resp.GetEvent().(type) {
		case *inferencev1.GenerateResponse_Delta:
			deltas++
			fmt.Print(ev.Delta.GetText())
		case *inferencev1.GenerateResponse_Error:
			fmt.Println()
			return fmt.Errorf("error event: %s (code %d): %s", ev.Error.GetStatus(), ev.Error.GetCode(), ev.Error.GetMessage())
		case *inferencev1.GenerateResponse_Done:
			d := ev.Done
			u, t := d.GetUsage(), d.GetTiming()
			fmt.Println()
			fmt.Printf("[done] finish_reason=%s deltas=%d\n", d.GetFinishReason(), deltas)
			fmt.Printf("[done] usage: prompt_tokens=%d completion_tokens=%d cached_tokens=%d\n",
				u.GetPromptTokens(), u.GetCompletionTokens(), u.GetCachedTokens())
			fmt.Printf("[done] timing: queue_ms=%.1f ttft_ms=%.1f total_ms=%.1f preemptions=%d\n",
				t.GetQueueMs(), t.GetTtftMs(), t.GetTotalMs(), d.GetPreemptions())
			if d.GetFinishReason() == inferencev1.FinishReason_FINISH_REASON_UNSPECIFIED {
				return fmt.Errorf("done event without a finish reason")
			}
			if u.GetPromptTokens() != promptTokens {
				return fmt.Errorf("prompt_tokens %d differs from CountTokens' %d", u.GetPromptTokens(), promptTokens)
			}
			return closeStream(stream)
		default:
			return fmt.Errorf("event without a payload for %q", resp.GetRequestId())
		}
	}
}

// closeStream half-closes the stream and waits for the server to end it.
func closeStream(stream inferencev1.InferenceService_GenerateClient) error {
	if err := stream.CloseSend(); err != nil {
		return fmt.Errorf("close send: %w", err)
	}
	for {
		resp, err := stream.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("stream ended with %w after the done event", err)
		}
		return fmt.Errorf("unexpected event after done: %v", resp)
	}
}

// generateJSON asks for one JSON document and checks it against the schema's required keys.
func generateJSON(client inferencev1.InferenceServiceClient, prompt string, timeout time.Duration) error {
	ctx, cancel := callContext(timeout)
	defer cancel()
	fmt.Printf("[json] prompt=%q schema=%s\n", prompt, personSchema)
	resp, err := client.GenerateJSON(ctx, &inferencev1.GenerateJSONRequest{
		Prompt:     prompt,
		JsonSchema: personSchema,
		Sampling: &inferencev1.SamplingParams{
			MaxTokens:   proto.Int32(256),
			Temperature: proto.Float32(0),
		},
	})
	if err != nil {
		if status.Code(err) == codes.Unimplemented {
			fmt.Printf("[json] GenerateJSON is UNIMPLEMENTED on this server (%s); skipped\n", status.Convert(err).Message())
			return nil
		}
		return fmt.Errorf("GenerateJSON: %w", err)
	}
	fmt.Printf("[json] %s\n", resp.GetJson())
	u := resp.GetUsage()
	fmt.Printf("[json] finish_reason=%s prompt_tokens=%d completion_tokens=%d total_ms=%.1f\n",
		resp.GetFinishReason(), u.GetPromptTokens(), u.GetCompletionTokens(), resp.GetTiming().GetTotalMs())
	var doc map[string]interface{}
	if err := json.Unmarshal([]byte(resp.GetJson()), &doc); err != nil {
		return fmt.Errorf("GenerateJSON returned invalid JSON: %w", err)
	}
	if _, ok := doc["name"].(string); !ok {
		return fmt.Errorf("GenerateJSON document lacks a string \"name\"")
	}
	if age, ok := doc["age"].(float64); !ok || age != float64(int64(age)) {
		return fmt.Errorf("GenerateJSON document lacks an integer \"age\"")
	}
	return nil
}
