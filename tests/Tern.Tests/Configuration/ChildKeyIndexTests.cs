using Microsoft.Extensions.Configuration;
using Microsoft.Extensions.Configuration.Memory;
using Tern.Proxy.Configuration;

namespace Tern.Tests.Configuration;

/// <summary>
/// Tern's providers answer GetChildKeys from an index (ChildKeyIndex) instead of .NET's scan of
/// every key. Whatever reads the configuration must see exactly what .NET's own providers give:
/// the same sections, in the same order, with the same key casing and values. (Past 16 keys under
/// one parent .NET's sort is unstable, and its casing of keys that differ only in case is left to
/// chance: ChildKeyIndex says so.)
/// </summary>
public sealed class ChildKeyIndexTests
{
    // Numeric keys (sorted as numbers), the same key in two casings, empty segments, a key that is
    // both a value and a parent, and keys that only one of the two providers holds.
    private static readonly Dictionary<string, string?> s_first = new(StringComparer.OrdinalIgnoreCase)
    {
        ["ReverseProxy:Routes:r10:ClusterId"] = "c",
        ["ReverseProxy:Routes:r2:ClusterId"] = "c",
        ["ReverseProxy:Routes:r2:Match:Hosts:10"] = "j",
        ["ReverseProxy:Routes:r2:Match:Hosts:2"] = "b",
        ["ReverseProxy:Routes:r2:Match:Hosts:0"] = "a",
        ["ReverseProxy:routes:R3:order"] = "1",
        ["ReverseProxy:Clusters:c:Destinations:d1:Address"] = "http://127.0.0.1:1/",
        ["a::b"] = "empty segment",
        [":x"] = "leading",
        ["y:"] = "trailing",
        ["Tern"] = "a value",
        ["Tern:Https:Port"] = "8443",
        ["Z"] = null,
    };

    private static readonly Dictionary<string, string?> s_second = new(StringComparer.OrdinalIgnoreCase)
    {
        ["reverseproxy:ROUTES:r2:ClusterId"] = "d",
        ["ReverseProxy:Routes:r1:ClusterId"] = "c",
        ["ReverseProxy:Routes:r2:Match:Hosts:1"] = "x",
        ["tern:https:port"] = "9443",
        ["A::B"] = "override",
    };

    [Fact]
    public void EverySection_ListsAsDotNetsOwnProvidersDo()
    {
        var stock = new ConfigurationRoot([Memory(s_first), Memory(s_second)]);
        var indexed = new ConfigurationRoot([Gate(s_first), Gate(s_second)]);

        Assert.Equal(Describe(stock), Describe(indexed));
        Assert.Equal(stock.AsEnumerable().ToList(), indexed.AsEnumerable().ToList());
        // The walk reached the leaves; the later provider's casing names the sections, as in .NET's.
        Assert.Contains("reverseproxy:ROUTES:r2:Match:Hosts:10=j", Describe(indexed));
    }

    [Fact]
    public void NewData_IsListedAfterEachPublish()
    {
        var gate = new ConfigurationGate();
        gate.Publish(s_first);
        Assert.Equal(["r10", "r2", "R3"], gate.Root.GetSection("ReverseProxy:Routes").GetChildren().Select(c => c.Key));

        gate.Publish([new("ReverseProxy:Routes:only:ClusterId", "c")]);
        Assert.Equal(["only"], gate.Root.GetSection("ReverseProxy:Routes").GetChildren().Select(c => c.Key));

        gate.Set("ReverseProxy:Routes:added:ClusterId", "c");
        Assert.Equal(["added", "only"], gate.Root.GetSection("ReverseProxy:Routes").GetChildren().Select(c => c.Key));
    }

    /// <summary>Every section, depth first, as path=value, in the order GetChildren gives them.</summary>
    private static List<string> Describe(IConfiguration configuration)
    {
        var lines = new List<string>();
        void Walk(IConfiguration node)
        {
            foreach (var child in node.GetChildren())
            {
                lines.Add($"{child.Path}={child.Value}");
                Walk(child);
            }
        }

        Walk(configuration);
        return lines;
    }

    private static MemoryConfigurationProvider Memory(Dictionary<string, string?> data)
    {
        var provider = new MemoryConfigurationProvider(new MemoryConfigurationSource());
        foreach (var (key, value) in data)
        {
            provider.Set(key, value);
        }

        return provider;
    }

    private static ConfigurationGate Gate(Dictionary<string, string?> data)
    {
        var gate = new ConfigurationGate();
        gate.Publish(data);
        return gate;
    }
}
