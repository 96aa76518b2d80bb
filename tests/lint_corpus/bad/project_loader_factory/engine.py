class Engine:
    def __init__(self, net, opt):
        self.net, self.opt = net, opt

    def step(self, batch):
        loss = self.net(batch).sum()
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
