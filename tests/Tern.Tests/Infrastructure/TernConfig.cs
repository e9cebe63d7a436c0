using System.Text.Json;
using System.Text.Json.Nodes;

namespace Tern.Tests.Infrastructure;

/// <summary>An appsettings.json for one test's proxy: free ports, test certificates, demo off, quiet logs.</summary>
public sealed class TernConfig
{
    public TernConfig(string engine)
    {
        Engine = engine;
        Tern = new JsonObject
        {
            ["Https"] = new JsonObject { ["Port"] = HttpsPort },
            ["Http"] = new JsonObject { ["Port"] = HttpPort },
            ["Management"] = new JsonObject { ["Port"] = ManagementPort },
            ["Demo"] = new JsonObject { ["Enabled"] = false },
            ["Shutdown"] = new JsonObject { ["DrainTimeout"] = "00:00:05" },
            ["Tls"] = new JsonObject { ["Engine"] = engine },
        };
        Certificates(("default", TestPki.Localhost, []));
        ReverseProxy = new JsonObject { ["Routes"] = new JsonObject(), ["Clusters"] = new JsonObject() };
    }

    /// <summary>The TLS engine under test (Tern:Tls:Engine).</summary>
    public string Engine { get; }

    public JsonObject Tls => (JsonObject)Tern["Tls"]!;

    public int HttpsPort { get; } = FreePort.Next();

    public int HttpPort { get; } = FreePort.Next();

    public int ManagementPort { get; } = FreePort.Next();

    public JsonObject Tern { get; }

    public JsonObject ReverseProxy { get; set; }

    /// <summary>The level of Tern.Proxy.Forwarding's log (Debug shows each request it changes).</summary>
    public string ForwardingLogLevel { get; set; } = "Information";

    /// <summary>The Kestrel section (Tern reads its Limits), written only when set.</summary>
    public JsonObject? Kestrel { get; set; }

    /// <summary>A proxy whose catch-all route "all" sends everything to cluster "app" with these upstreams.</summary>
    public static TernConfig To(string engine, params TestUpstream[] upstreams) => new TernConfig(engine).Route("all", "app", "{**catch-all}").Cluster("app", upstreams);

    public TernConfig Route(string id, string cluster, string path, JsonObject? extra = null)
    {
        var route = extra ?? new JsonObject();
        route["ClusterId"] = cluster;
        route["Match"] = new JsonObject { ["Path"] = path };
        ((JsonObject)ReverseProxy["Routes"]!)[id] = route;
        return this;
    }

    public TernConfig Cluster(string id, TestUpstream[] upstreams, JsonObject? extra = null) =>
        Cluster(id, upstreams.Select(u => u.Address.ToString()).ToArray(), extra);

    public TernConfig Cluster(string id, string[] addresses, JsonObject? extra = null)
    {
        var cluster = extra ?? new JsonObject();
        var destinations = new JsonObject();
        for (var i = 0; i < addresses.Length; i++)
        {
            destinations[$"d{i + 1}"] = new JsonObject { ["Address"] = addresses[i] };
        }

        cluster["Destinations"] = destinations;
        ((JsonObject)ReverseProxy["Clusters"]!)[id] = cluster;
        return this;
    }

    public TernConfig Certificates(params (string Name, PemPair Pair, string[] Hosts)[] certificates)
    {
        var section = new JsonObject();
        foreach (var (name, pair, hosts) in certificates)
        {
            section[name] = new JsonObject
            {
                ["CertificatePath"] = pair.CertificatePath,
                ["KeyPath"] = pair.KeyPath,
                ["Hosts"] = new JsonArray(hosts.Select(h => (JsonNode)JsonValue.Create(h)!).ToArray()),
            };
        }

        Tls["Certificates"] = section;
        return this;
    }

    public string ToJson()
    {
        var json = new JsonObject
        {
            ["Tern"] = Tern.DeepClone(),
            ["ReverseProxy"] = ReverseProxy.DeepClone(),
            ["Logging"] = new JsonObject { ["LogLevel"] = new JsonObject { ["Default"] = "Warning", ["Tern.Proxy.Tls"] = "Debug", ["Tern.Proxy.Configuration"] = "Information", ["Tern.Proxy.Forwarding"] = ForwardingLogLevel } },
        };
        if (Kestrel is not null)
        {
            json["Kestrel"] = Kestrel.DeepClone();
        }

        return json.ToJsonString(new JsonSerializerOptions { WriteIndented = true });
    }
}
