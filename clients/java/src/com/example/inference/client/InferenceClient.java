package com.example.inference.client;

import com.example.inference.v1.CountTokensRequest;
import com.example.inference.v1.CountTokensResponse;
import com.example.inference.v1.Done;
import com.example.inference.v1.FinishReason;
import com.example.inference.v1.GenerateJSONRequest;
import com.example.inference.v1.GenerateJSONResponse;
import com.example.inference.v1.GenerateRequest;
import com.example.inference.v1.GenerateResponse;
import com.example.inference.v1.GetModelInfoRequest;
import com.example.inference.v1.GetModelInfoResponse;
import com.example.inference.v1.InferenceServiceGrpc;
import com.example.inference.v1.Priority;
import com.example.inference.v1.SamplingParams;
import com.example.inference.v1.Timing;
import com.example.inference.v1.Usage;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import io.grpc.Channel;
import io.grpc.ClientInterceptors;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.Metadata;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.netty.GrpcSslContexts;
import io.grpc.netty.NettyChannelBuilder;
import io.grpc.stub.MetadataUtils;
import io.grpc.stub.StreamObserver;
import io.netty.handler.ssl.SslContextBuilder;
import java.io.File;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;

/**
 * Small example client for inference.v1.InferenceService.
 *
 * <p>Asks GetModelInfo what the server runs (printing the model name and context size) and
 * CountTokens how long the prompt is, streams one Generate request (printing the text as it arrives,
 * then the done event's finish reason, usage and timing; prompt_tokens must equal the count) and
 * makes one GenerateJSON call (printing the JSON document). Exits non-zero on any failure, except
 * that a GenerateJSON answered with UNIMPLEMENTED is reported and tolerated.
 *
 * <p>Usage: {@code inference-client [-addr host:port] [-prompt TEXT] [-max-tokens N] [-timeout SECONDS]
 * [-skip-json] [-tls-ca FILE [-tls-cert FILE -tls-key FILE]] [-token TOKEN]}
 *
 * <p>TLS: {@code -tls-ca} is the CA of the server's certificate, {@code -tls-cert}/{@code -tls-key} a
 * client certificate for mTLS (PKCS#8 PEM key). The bearer token ({@code -token}, default
 * $INFERENCE_TOKEN) is sent as "authorization: Bearer" metadata (docs/security.md).
 */
public final class InferenceClient {
  private static final String PERSON_SCHEMA =
      "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
          + "\"age\":{\"type\":\"integer\"}},\"required\":[\"name\",\"age\"]}";
  private static final String REQUEST_ID = "java-1";
  private static final Object COMPLETED = new Object();

  private static final PrintStream OUT =
      new PrintStream(new FileOutputStream(FileDescriptor.out), true, StandardCharsets.UTF_8);

  /** Raised for any failure the client reports. */
  static final class ClientException extends Exception {
    ClientException(String message) {
      super(message);
    }
  }

  private InferenceClient() {}

  public static void main(String[] args) throws InterruptedException {
    String addr = "localhost:50051";
    String prompt = "Once upon a time, a lighthouse keeper";
    String jsonPrompt = "Describe a person named Alice who is 30 years old as JSON.";
    int maxTokens = 32;
    long timeoutS = 120;
    boolean skipJson = false;
    String tlsCa = null;
    String tlsCert = null;
    String tlsKey = null;
    String token = System.getenv("INFERENCE_TOKEN");
    for (int i = 0; i < args.length; i++) {
      String a = args[i].replaceFirst("^--", "-");
      switch (a) {
        case "-addr":
          addr = args[++i];
          break;
        case "-prompt":
          prompt = args[++i];
          break;
        case "-json-prompt":
          jsonPrompt = args[++i];
          break;
        case "-max-tokens":
          maxTokens = Integer.parseInt(args[++i]);
          break;
        case "-timeout":
          timeoutS = Long.parseLong(args[++i]);
          break;
        case "-skip-json":
          skipJson = true;
          break;
        case "-tls-ca":
          tlsCa = args[++i];
          break;
        case "-tls-cert":
          tlsCert = args[++i];
          break;
        case "-tls-key":
          tlsKey = args[++i];
          break;
        case "-token":
          token = args[++i];
          break;
        default:
          System.err.println("java-client: unknown argument " + args[i]);
          System.err.println(
              "usage: inference-client [-addr host:port] [-prompt TEXT] [-json-prompt TEXT]"
                  + " [-max-tokens N] [-timeout SECONDS] [-skip-json] [-tls-ca FILE]"
                  + " [-tls-cert FILE -tls-key FILE] [-token TOKEN]");
          System.exit(2);
      }
    }

    ManagedChannel channel;
    try {
      channel = openChannel(addr, tlsCa, tlsCert, tlsKey);
    } catch (java.io.IOException | IllegalArgumentException | UnsupportedOperationException e) {
      // NOTE: grpc-java needs ALPN for TLS: netty-tcnative, or a netty that finds it in the JDK
      // (Debian bookworm's netty 4.1.48 does not with JDK 17, and has no netty-tcnative package).
      System.err.println("java-client: FAILED: TLS setup: " + e.getMessage());
      System.exit(1);
      return;
    }
    Channel calls = withToken(channel, token);
    int rc = 0;
    try {
      modelInfo(calls, timeoutS);
      int promptTokens = countTokens(calls, prompt, timeoutS);
      generate(calls, prompt, maxTokens, promptTokens, timeoutS);
      if (!skipJson) {
        generateJson(calls, jsonPrompt, timeoutS);
      }
      OUT.println("java-client: OK");
    } catch (ClientException | StatusRuntimeException e) {
      System.err.println(
          "java-client: FAILED: "
              + (e instanceof StatusRuntimeException
                  ? describe(((StatusRuntimeException) e).getStatus())
                  : e.getMessage()));
      rc = 1;
    } finally {
      channel.shutdownNow().awaitTermination(5, TimeUnit.SECONDS);
    }
    System.exit(rc);
  }

  /** Plaintext without a CA or certificate; else TLS (with a client certificate for mTLS). */
  private static ManagedChannel openChannel(String addr, String ca, String cert, String key)
      throws java.io.IOException {
    if (ca == null && cert == null) {
      return ManagedChannelBuilder.forTarget(addr).usePlaintext().build();
    }
    SslContextBuilder ssl = GrpcSslContexts.forClient();
    if (ca != null) {
      ssl.trustManager(new File(ca));
    }
    if (cert != null) {
      if (key == null) {
        throw new IllegalArgumentException("-tls-cert needs -tls-key");
      }
      ssl.keyManager(new File(cert), new File(key));
    }
    return NettyChannelBuilder.forTarget(addr).sslContext(ssl.build()).build();
  }

  /** Every call carries "authorization: Bearer <token>" when a token is given. */
  private static Channel withToken(ManagedChannel channel, String token) {
    if (token == null || token.isEmpty()) {
      return channel;
    }
    Metadata headers = new Metadata();
    headers.put(Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER), "Bearer " + token);
    return ClientInterceptors.intercept(channel, MetadataUtils.newAttachHeadersInterceptor(headers));
  }

  /** Formats a status as "CODE: description (cause)" without a stack trace. */
  private static String describe(Status s) {
    StringBuilder b = new StringBuilder(s.getCode().name());
    if (s.getDescription() != null) {
      b.append(": ").append(s.getDescription());
    }
    if (s.getCause() != null) {
      b.append(" (").append(s.getCause()).append(')');
    }
    return b.toString();
  }

  /** Prints what the server runs: the model, its context and vocabulary. */
  private static void modelInfo(Channel channel, long timeoutS) throws ClientException {
    GetModelInfoResponse info =
        InferenceServiceGrpc.newBlockingStub(channel)
            .withDeadlineAfter(timeoutS, TimeUnit.SECONDS)
            .getModelInfo(GetModelInfoRequest.getDefaultInstance());
    OUT.printf(
        "[info] model=\"%s\" file=%s architecture=%s parameters=%d quantization=%s%n",
        info.getName(),
        info.getFileName(),
        info.getArchitecture(),
        info.getParameterCount(),
        info.getQuantization());
    OUT.printf(
        "[info] context=%d (trained %d) vocab=%d max_running=%d server=%s%n",
        info.getLimits().getContextSize(),
        info.getTrainingContext(),
        info.getVocabSize(),
        info.getMaxRunning(),
        info.getServerVersion());
    if (info.getFileName().isEmpty() || info.getLimits().getContextSize() == 0 || info.getVocabSize() == 0) {
      throw new ClientException("GetModelInfo: lacks the file name, context size or vocabulary size");
    }
  }

  /** The number of tokens Generate will prefill for the prompt. */
  private static int countTokens(Channel channel, String prompt, long timeoutS) {
    CountTokensResponse resp =
        InferenceServiceGrpc.newBlockingStub(channel)
            .withDeadlineAfter(timeoutS, TimeUnit.SECONDS)
            .countTokens(CountTokensRequest.newBuilder().setText(prompt).build());
    OUT.printf("[count] prompt_tokens=%d max_new_tokens=%d%n", resp.getCount(), resp.getMaxNewTokens());
    return resp.getCount();
  }

  /** Sends one request on a Generate stream and prints its events. */
  private static void generate(Channel channel, String prompt, int maxTokens, int promptTokens, long timeoutS)
      throws ClientException, InterruptedException {
    BlockingQueue<Object> events = new LinkedBlockingQueue<>();
    StreamObserver<GenerateRequest> requests =
        InferenceServiceGrpc.newStub(channel)
            .withDeadlineAfter(timeoutS, TimeUnit.SECONDS)
            .generate(
                new StreamObserver<GenerateResponse>() {
                  @Override
                  public void onNext(GenerateResponse value) {
                    events.add(value);
                  }

                  @Override
                  public void onError(Throwable t) {
                    events.add(t);
                  }

                  @Override
                  public void onCompleted() {
                    events.add(COMPLETED);
                  }
                });
    requests.onNext(
        GenerateRequest.newBuilder()
            .setRequestId(REQUEST_ID)
            .setPrompt(prompt)
            .setSampling(
                SamplingParams.newBuilder()
                    .setMaxTokens(maxTokens)
                    .setTemperature(0.7f)
                    .setSeed(42))
            .setPriority(Priority.PRIORITY_INTERACTIVE)
            .build());
    OUT.printf("[generate] request_id=%s prompt=\"%s\" max_tokens=%d%n", REQUEST_ID, prompt, maxTokens);

    int deltas = 0;
    while (true) {
      Object ev = events.poll(timeoutS + 5, TimeUnit.SECONDS);
      if (ev == null) {
        requests.onError(Status.CANCELLED.withDescription("client timeout").asException());
        throw new ClientException("Generate: no event within " + timeoutS + " s");
      }
      if (ev == COMPLETED) {
        throw new ClientException("Generate: stream ended before the done event");
      }
      if (ev instanceof Throwable) {
        throw new ClientException("Generate: " + describe(Status.fromThrowable((Throwable) ev)));
      }
      GenerateResponse resp = (GenerateResponse) ev;
      if (!REQUEST_ID.equals(resp.getRequestId())) {
        requests.onError(Status.CANCELLED.asException());
        throw new ClientException("Generate: event for unknown request_id " + resp.getRequestId());
      }
      switch (resp.getEventCase()) {
        case DELTA:
          deltas++;
          OUT.print(resp.getDelta().getText());
          OUT.flush();
          break;
        case ERROR:
          com.example.inference.v1.Error err = resp.getError();
          OUT.println();
          requests.onError(Status.CANCELLED.asException());
          throw new ClientException(
              String.format(
                  "Generate: error event: %s (code %d): %s",
                  err.getStatus(), err.getCode(), err.getMessage()));
        case DONE:
          Done done = resp.getDone();
          Usage u = done.getUsage();
          Timing t = done.getTiming();
          OUT.println();
          OUT.printf("[done] finish_reason=%s deltas=%d%n", done.getFinishReason(), deltas);
          OUT.printf(
              "[done] usage: prompt_tokens=%d completion_tokens=%d cached_tokens=%d%n",
              u.getPromptTokens(), u.getCompletionTokens(), u.getCachedTokens());
          OUT.printf(
              "[done] timing: queue_ms=%.1f ttft_ms=%.1f total_ms=%.1f preemptions=%d%n",
              t.getQueueMs(), t.getTtftMs(), t.getTotalMs(), done.getPreemptions());
          if (done.getFinishReason() == FinishReason.FINISH_REASON_UNSPECIFIED) {
            requests.onError(Status.CANCELLED.asException());
            throw new ClientException("Generate: done event without a finish reason");
          }
          if (u.getPromptTokens() != promptTokens) {
            requests.onError(Status.CANCELLED.asException());
            throw new ClientException(
                "Generate: prompt_tokens " + u.getPromptTokens() + " differs from CountTokens' " + promptTokens);
          }
          closeStream(requests, events);
          return;
        default:
          requests.onError(Status.CANCELLED.asException());
          throw new ClientException("Generate: event without a payload");
      }
    }
  }

  /** Half-closes the stream and waits for the server to end it. */
  private static void closeStream(StreamObserver<GenerateRequest> requests, BlockingQueue<Object> events)
      throws ClientException, InterruptedException {
    requests.onCompleted();
    Object ev = events.poll(30, TimeUnit.SECONDS);
    if (ev == COMPLETED) {
      return;
    }
    if (ev == null) {
      throw new ClientException("Generate: server did not end the stream after the client half-closed it");
    }
    if (ev instanceof Throwable) {
      throw new ClientException(
          "Generate: stream ended with " + describe(Status.fromThrowable((Throwable) ev)) + " after the done event");
    }
    throw new ClientException("Generate: unexpected event after done: " + ev);
  }

  /** Asks for one JSON document and checks it against the schema's required keys. */
  private static void generateJson(Channel channel, String prompt, long timeoutS)
      throws ClientException {
    OUT.printf("[json] prompt=\"%s\" schema=%s%n", prompt, PERSON_SCHEMA);
    GenerateJSONResponse resp;
    try {
      resp =
          InferenceServiceGrpc.newBlockingStub(channel)
              .withDeadlineAfter(timeoutS, TimeUnit.SECONDS)
              .generateJSON(
                  GenerateJSONRequest.newBuilder()
                      .setPrompt(prompt)
                      .setJsonSchema(PERSON_SCHEMA)
                      .setSampling(SamplingParams.newBuilder().setMaxTokens(256).setTemperature(0f))
                      .build());
    } catch (StatusRuntimeException e) {
      if (e.getStatus().getCode() == Status.Code.UNIMPLEMENTED) {
        OUT.printf(
            "[json] GenerateJSON is UNIMPLEMENTED on this server (%s); skipped%n",
            e.getStatus().getDescription());
        return;
      }
      throw new ClientException("GenerateJSON: " + describe(e.getStatus()));
    }
    OUT.printf("[json] %s%n", resp.getJson());
    OUT.printf(
        "[json] finish_reason=%s prompt_tokens=%d completion_tokens=%d total_ms=%.1f%n",
        resp.getFinishReason(),
        resp.getUsage().getPromptTokens(),
        resp.getUsage().getCompletionTokens(),
        resp.getTiming().getTotalMs());
    JsonObject doc;
    try {
      doc = JsonParser.parseString(resp.getJson()).getAsJsonObject();
    } catch (RuntimeException e) {
      throw new ClientException("GenerateJSON returned invalid JSON: " + e.getMessage());
    }
    JsonElement name = doc.get("name");
    if (name == null || !name.isJsonPrimitive() || !name.getAsJsonPrimitive().isString()) {
      throw new ClientException("GenerateJSON document lacks a string \"name\"");
    }
    JsonElement age = doc.get("age");
    if (age == null
        || !age.isJsonPrimitive()
        || !age.getAsJsonPrimitive().isNumber()
        || age.getAsBigDecimal().stripTrailingZeros().scale() > 0) {
      throw new ClientException("GenerateJSON document lacks an integer \"age\"");
    }
  }
}
