using Tern.Tests.Infrastructure;
using Xunit.Abstractions;

namespace Tern.Tests.Tls;

/// <summary>Runs alone (no other test allocating in the process meanwhile).</summary>
[CollectionDefinition(nameof(RunsAlone), DisableParallelization = true)]
public sealed class RunsAlone;

/// <summary>
/// The OpenSSL engine allocates nothing per TLS record in steady state. Measured on the whole
/// process (proxy, test client and upstream share it), so two checks:
/// - the runtime's allocation samples over 256 MB of records name no type of the engine's;
/// - the bytes allocated per extra 16 KB record, on one connection and on 64 at once, stay under
///   a bound that catches an allocation the size of a record, such as a new block from the block
///   pool for each record. (The pool may allocate a block at any time after its trim timer has
///   released some, so its types are left to this check.) What is left, about 450 B, is Kestrel's
///   flush state machines, the socket's I/O vectors and HttpClient's reads; the SslStream
///   engine's figure is about 550 B.
/// </summary>
[Collection(nameof(RunsAlone))]
public sealed class AllocationTests(ITestOutputHelper output) : IAsyncLifetime
{
    private TestUpstream _upstream = null!;
    private TernInstance _tern = null!;

    public async Task InitializeAsync()
    {
        _upstream = await TestUpstream.StartAsync();
        _tern = await TernInstance.StartAsync(TernConfig.To(Proxy.Tls.TlsEngines.OpenSsl, _upstream));
    }

    public async Task DisposeAsync()
    {
        await _tern.DisposeAsync();
        await _upstream.DisposeAsync();
    }

    [Fact]
    public async Task Downloads_AllocateNothingPerRecordInTheEngine()
    {
        using var client = _tern.CreateClient();
        var buffer = new byte[64 * 1024];
        for (var i = 0; i < 5; i++)
        {
            await DownloadAsync(client, 16, buffer); // warm-up: JIT, pools, connection
        }

        // The upstream writes the same 64 KB chunk count times; the proxy turns it into 16 KB records.
        var shortOne = long.MaxValue;
        var longOne = long.MaxValue;
        for (var i = 0; i < 3; i++)
        {
            shortOne = Math.Min(shortOne, await AllocatedDuringAsync(() => DownloadAsync(client, 16, buffer)));
            longOne = Math.Min(longOne, await AllocatedDuringAsync(() => DownloadAsync(client, 272, buffer)));
        }

        // The runtime samples an allocation about every 100 KB allocated, naming its type.
        var samples = new AllocationSamples();
        for (var i = 0; i < 4; i++)
        {
            await DownloadAsync(client, 1024, buffer);
        }

        samples.Dispose();

        // 64 downloads at once: pools sized for a few connections run dry here (an earlier design
        // allocated 20 KB per record this way).
        var clients = Enumerable.Range(0, 64).Select(_ => _tern.CreateClient()).ToArray();
        var buffers = clients.Select(_ => new byte[64 * 1024]).ToArray();
        await Task.WhenAll(clients.Select((c, i) => DownloadAsync(c, 16, buffers[i])));
        var few = await AllocatedDuringAsync(() => Task.WhenAll(clients.Select((c, i) => DownloadAsync(c, 4, buffers[i]))));
        var many = await AllocatedDuringAsync(() => Task.WhenAll(clients.Select((c, i) => DownloadAsync(c, 68, buffers[i]))));
        var concurrentPerRecord = (many - few) / (64.0 * (68 - 4) * 64 * 1024 / (16 * 1024));
        output.WriteLine($"64 downloads at once: 256 KB each {few} B, 4.25 MB each {many} B: {concurrentPerRecord:F1} B per extra 16 KB record, whole process");
        foreach (var c in clients)
        {
            c.Dispose();
        }

        var records = (272 - 16) * 64 * 1024 / (16 * 1024);
        var perRecord = (double)(longOne - shortOne) / records;
        output.WriteLine($"allocated: 1 MB download {shortOne} B, 17 MB download {longOne} B: {perRecord:F1} B per extra 16 KB record, whole process");
        output.WriteLine("allocation samples over 256 MB: " + string.Join("; ", samples.Types.OrderByDescending(p => p.Value).Select(p => $"{p.Value} {p.Key}")));
        // The engine's types, not Tern's per-request middleware: the samples fall on whatever
        // allocation crosses each 100 KB, so now and then on one of the four requests' state
        // machines (ProxyErrorResponses'), which says nothing about records.
        Assert.NotEmpty(samples.Types); // else the check below would pass on nothing
        Assert.DoesNotContain(samples.Types.Keys, IsEngines);
        Assert.True(perRecord < 1024, $"{perRecord:F1} bytes allocated per 16 KB record (1 MB: {shortOne} B, 17 MB: {longOne} B)");
        Assert.True(concurrentPerRecord < 1024, $"{concurrentPerRecord:F1} bytes allocated per 16 KB record with 64 downloads at once");
    }

    /// <summary>
    /// Whether an allocated type is the TLS engine's, or is built on one of its types (an array of
    /// one, a state machine box of one of its async methods). Judged on the type itself, not on the
    /// sample's type name, which leaves out the namespace of nested types: closures and
    /// compiler-made types.
    /// </summary>
    private static bool IsEngines(Type type)
    {
        if (type.HasElementType)
        {
            return IsEngines(type.GetElementType()!);
        }

        if (type.IsConstructedGenericType && type.GetGenericArguments().Any(IsEngines))
        {
            return true;
        }

        var outermost = type;
        while (outermost.DeclaringType is { } declaring)
        {
            outermost = declaring;
        }

        return outermost.Assembly == typeof(Proxy.Tls.TlsEngines).Assembly &&
               outermost.Namespace?.StartsWith("Tern.Proxy.Tls", StringComparison.Ordinal) == true;
    }

    private static async Task<long> AllocatedDuringAsync(Func<Task> action)
    {
        var before = GC.GetTotalAllocatedBytes(precise: true);
        await action();
        return GC.GetTotalAllocatedBytes(precise: true) - before;
    }

    private static async Task DownloadAsync(HttpClient client, int chunks, byte[] buffer)
    {
        using var response = await client.GetAsync(new Uri($"/stream/{chunks}/0", UriKind.Relative), HttpCompletionOption.ResponseHeadersRead);
        response.EnsureSuccessStatusCode();
        await using var body = await response.Content.ReadAsStreamAsync();
        long total = 0;
        int read;
        while ((read = await body.ReadAsync(buffer)) > 0)
        {
            total += read;
        }

        Assert.Equal(chunks * 64L * 1024, total);
    }
}

internal sealed class AllocationSamples : System.Diagnostics.Tracing.EventListener
{
    /// <summary>How many samples fell on each type, resolved from the events' type handles.</summary>
    public System.Collections.Concurrent.ConcurrentDictionary<Type, int> Types { get; } = new();

    protected override void OnEventSourceCreated(System.Diagnostics.Tracing.EventSource eventSource)
    {
        if (eventSource.Name == "Microsoft-Windows-DotNETRuntime")
        {
            EnableEvents(eventSource, System.Diagnostics.Tracing.EventLevel.Verbose, (System.Diagnostics.Tracing.EventKeywords)0x1);
        }
    }

    protected override void OnEventWritten(System.Diagnostics.Tracing.EventWrittenEventArgs eventData)
    {
        if (eventData.EventName?.StartsWith("GCAllocationTick", StringComparison.Ordinal) == true && eventData.Payload is { } payload)
        {
            var handle = payload[eventData.PayloadNames!.IndexOf("TypeID")] switch
            {
                nint n => n,
                ulong u => (nint)u,
                _ => 0,
            };
            if (handle != 0 && Type.GetTypeFromHandle(RuntimeTypeHandle.FromIntPtr(handle)) is { } type)
            {
                Types.AddOrUpdate(type, 1, (_, c) => c + 1);
            }
        }
    }
}
