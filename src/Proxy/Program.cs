return await Tern.Proxy.TernHost.RunAsync(args);
